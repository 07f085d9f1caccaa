"""Running an extension's declared checks, whatever shape they were written in, into Decisions.

The loader asks two questions of each extension: is its hardware here (``is_available``), and
can it be built and run with this software (``check_compatible``). Extensions answer with a
:class:`~opforge.decision.Decision`, but code ported from elsewhere answers otherwise, and none
of it may crash a load:

* a ``bool``: ``True`` is ``Accepted``; ``False`` is ``Rejected`` with a reason naming the method;
* the seed API's names, ColossalAI's among them: ``is_hardware_available`` (with
  ``is_available``), ``assert_hardware_compatible`` and ``assert_compatible`` (with
  ``check_compatible``): an assertion that fails is ``Rejected(its message)``;
* a method that takes no platform (``def is_available(self)``) is called without one;
* a check that raises is ``Rejected`` with the exception, not an error at load time.

>>> class Old:
...     def is_available(self): return False
...     def assert_hardware_compatible(self):
...         assert False, "needs CUDA 12"
>>> print(run(Old(), AVAILABLE, None))
rejected: Old.is_available() returned False
>>> print(run(Old(), COMPATIBLE, None))
rejected: Old.assert_hardware_compatible(): needs CUDA 12
"""

from __future__ import annotations

import inspect

from .decision import Accepted, Decision, Rejected, first_rejection

#: The method names that answer each question: opforge's own first, then the seed API's aliases.
AVAILABLE = ("is_available", "is_hardware_available")
COMPATIBLE = ("check_compatible", "assert_hardware_compatible", "assert_compatible")


def run(ext, names: tuple[str, ...], platform) -> Decision:
    """Every method of ``names`` that ``ext`` has, called and turned into one Decision (the first rejection)."""
    return first_rejection([_one(ext, name, platform) for name in names if hasattr(ext, name)])


def _one(ext, name: str, platform) -> Decision:
    where = f"{type(ext).__name__}.{name}()"
    method = getattr(ext, name)
    try:
        result = method(platform) if _takes_platform(type(ext), name, method) else method()
    except AssertionError as exc:  # its message's first line (pytest's rewriting appends the expression)
        text = str(exc).strip().splitlines()
        return Rejected(f"{where}: {text[0]}" if text else f"{where} failed its assertion")
    except Exception as exc:  # noqa: BLE001 (a check that breaks rejects its extension; the load goes on)
        return Rejected(f"{where} raised {type(exc).__name__}: {exc}")
    if isinstance(result, Decision):
        return result
    if result is None and name.startswith("assert_"):
        return Accepted()
    if isinstance(result, bool):
        return Accepted() if result else Rejected(f"{where} returned False")
    return Rejected(f"{where} returned {result!r}, not a Decision or a bool")


_TAKES_PLATFORM: dict[tuple[type, str], bool] = {}


def _takes_platform(cls: type, name: str, method) -> bool:
    """Does the bound ``method`` take an argument (the platform)? Memoized per class and name."""
    key = (cls, name)
    found = _TAKES_PLATFORM.get(key)
    if found is None:
        try:
            params = inspect.signature(method).parameters.values()
            found = any(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL) for p in params)
        except (TypeError, ValueError):  # no signature to read: try it with the platform
            found = True
        _TAKES_PLATFORM[key] = found
    return found
