"""A compiled op with candidate configs, chosen as a Triton kernel's are (``TunedOp``).

Some kernels are C++/CUDA ops (an extension's ``torch.ops``) whose launch takes a few config
integers (the block sparse CUDA decode kernel's ring depth and CTAs an SM). ``TunedOp`` gives
them ``TunedKernel``'s choice: once per (tuning key, device), remembered in the process and kept
in opforge's cache (``tuning.py``), timed the way ``triton.autotune`` times, untimed under a CUDA
graph capture or with ``OPFORGE_TRITON_TUNING=off``. Its fingerprint names the op's sources
(their bytes, not their paths) instead of a Triton function's, so an edited kernel is tuned again.
A ``Route`` takes it as a candidate like any ``TunedKernel`` (its ``OpPlan`` launches the choice).
An op whose extension can describe its launch gives ``recipe``, and its plans are replayed from C++
as a Triton kernel's are (``native_launch``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence

import torch

from .. import settings
from .triton_launch import Choice, TunedKernel
from .tuning import TuningStore, fingerprint


class TunedOp(TunedKernel):
    """``configs`` (dicts of the same names, in the op's trailing argument order) for ``op``, a
    callable taking the launch's leading arguments then a config's values; ``sources``: the files
    whose bytes the choices depend on; ``recipe(choice, prefix, inputs, outputs)``: the native_launch
    recipe of the launch just made with ``prefix`` (``recipe_of_function``), or why there is none."""

    def __init__(self, family: str, name: str, op: Callable[[], Callable], configs: Sequence[dict],
                 sources: Callable[[], Sequence[str]], recipe: Callable | None = None):
        names = tuple(configs[0])
        if any(tuple(c) != names for c in configs):
            raise ValueError(f"{name}: every config must set {names}, in that order")
        self.family, self.name, self.fn = family, name, None
        self._op, self._sources, self._digest, self.recipe = op, sources, None, recipe
        self._resolved = None  # the op, once ``op()`` gave it (a loaded extension stays loaded)
        self._setup([Choice(i, dict(c), tuple(c.values()), 0, 0) for i, c in enumerate(configs)], None)

    def digest(self) -> str:
        """sha256 of the sources' bytes (read once)."""
        if self._digest is None:
            h = hashlib.sha256()
            for path in sorted(self._sources()):
                with open(path, "rb") as f:
                    h.update(f.read())
            self._digest = h.hexdigest()
        return self._digest

    def _store(self, device: int) -> TuningStore:
        store = self._stores.get(device)
        if store is None:
            fp = fingerprint(self.family, self.name, self.digest(), [c.kwargs for c in self.choices],
                             torch.__version__, *self._facts(device))
            store = self._stores[device] = TuningStore(settings.current().cache_dir, self.family, fp)
        return store

    def _facts(self, device: int) -> tuple:
        props = torch.cuda.get_device_properties(device)
        return props.name, (props.major, props.minor), torch.version.cuda

    def launch(self, choice: Choice, grid, args: tuple, device: int) -> None:
        """Run ``choice`` on ``args`` (``grid``: unused, the op sizes its own) on ``device``."""
        op = self._resolved
        if op is None:
            op = self._resolved = self._op()
        if device != torch.cuda.current_device():
            with torch.cuda.device(device):
                op(*args, *choice.values)
            return
        op(*args, *choice.values)

    def compiled(self, choice: Choice, args: tuple, device: int):
        return None


class OpPlan:
    """A call shape's launch of a ``TunedOp``, in the place of a ``triton_launch.Plan``: ``plan(prefix,
    device)`` runs the chosen config on this call's leading arguments; ``kernel``, ``choice`` and
    ``facts`` as a Plan's. ``native`` says why a ``NativeTable`` doesn't replay it (empty while it
    may: ``recipe``)."""

    __slots__ = ("kernel", "choice", "facts", "native")

    def __init__(self, kernel: TunedOp, choice: Choice, facts):
        self.kernel, self.choice, self.facts = kernel, choice, facts
        self.native = "" if kernel.recipe else "an op whose launch has no recipe: launched from Python"

    def __call__(self, prefix: tuple, device: int) -> None:
        self.kernel.launch(self.choice, None, prefix, device)

    def recipe(self, prefix: tuple, inputs: tuple, outputs: list):
        """The native_launch recipe of the launch just made with ``prefix`` (the op's ``recipe``)."""
        return self.kernel.recipe(self.choice, prefix, inputs, outputs)


__all__ = ["OpPlan", "TunedOp"]
