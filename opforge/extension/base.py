"""``Extension``: the declaration every implementation shares, its checks and its one load per process."""

from __future__ import annotations

import inspect
import threading
from typing import ClassVar

from .. import settings as settings_mod
from ..decision import Accepted, Decision, Rejected
from ..loaded import LoadedKernel
from ..status import READY, Status

BACKENDS = ("cpp", "cuda", "triton", "torch")

_LOADED: dict[str, LoadedKernel] = {}
_LOADED_LOCK = threading.RLock()

# Not forgotten by opforge.reset(): a loaded kernel stays this extension's kernel. Loading its
# binary again from another cache directory would register a second library under the same op
# namespace (a crash inside torch's loader, seen in CI when a test pointed the cache elsewhere).


class Extension:
    """Base class; use :class:`CppExtension`, :class:`CudaExtension`, :class:`TritonExtension`
    or :class:`TorchExtension`."""

    name: ClassVar[str] = ""
    kind: ClassVar[str] = ""
    backend: ClassVar[str] = ""
    priority: ClassVar[int] = 0
    """Higher is tried first."""
    support_aot: ClassVar[bool] = False
    support_jit: ClassVar[bool] = True
    devices: ClassVar[tuple[str, ...]] = ()
    """The tensor device types (``torch.device.type``) its ops take; empty: any."""
    aot_package: ClassVar[str] = "opforge._C"
    """The package its binary is prebuilt into at ``pip install``, and looked for at load time.
    A downstream package sets its own (``"mypkg._C"``; see ``opforge.aot.setup_extensions``)."""

    sources: ClassVar[tuple[str, ...]] = ()
    """Relative to the directory of the module that declares the class."""
    include_dirs: ClassVar[tuple[str, ...]] = ()
    cflags: ClassVar[tuple[str, ...]] = ()
    cuda_cflags: ClassVar[tuple[str, ...]] = ()
    ldflags: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def validate(cls) -> None:
        """Raise a TypeError that says what is wrong with the declaration."""
        from ..engine.key import check_name

        where = f"{cls.__module__}.{cls.__qualname__}"
        if not cls.name:
            raise TypeError(
                f"{where} has no `name`: opforge reads an extension's declaration (name, priority, sources, "
                "flags) from class attributes, before any instance exists, so attributes set in __init__ (as "
                "ColossalAI's `self._name = ...` or `self.priority = ...`) are not seen. Declare them in the class "
                f"body: `class {cls.__name__}(CppExtension): name = 'my_ext'; priority = 10` and drop __init__")
        try:
            check_name(cls.name)
        except ValueError as exc:
            raise TypeError(f"{where}: {exc}") from None
        try:
            inspect.signature(cls).bind()
        except TypeError:
            raise TypeError(f"{where}: opforge creates extensions with no arguments, but its __init__ needs some "
                            f"({inspect.signature(cls)}); move what __init__ sets into class attributes") from None
        if cls.backend not in BACKENDS:
            raise TypeError(f"{where}: backend {cls.backend!r} is not one of {', '.join(BACKENDS)}")
        if not cls.kind:
            raise TypeError(f"{where}: set `kind` (the kernel kind it implements, e.g. 'cpu_adam')")

    # -- checks (pure: they read the Platform only) --

    def is_available(self, platform) -> Decision:
        return Accepted()

    def check_compatible(self, platform) -> Decision:
        return Accepted()

    def serves(self, device: str | None) -> Decision:
        """Do its ops take tensors on ``device`` (a ``torch.device.type``; None: any device)?"""
        if device is None or not self.devices or device in self.devices:
            return Accepted()
        return Rejected(f"takes {' or '.join(self.devices)} tensors, not {device}")

    @property
    def needs_compiler(self) -> bool:
        return False

    # -- state and loading --

    def status(self, platform, prebuilt, settings: settings_mod.Settings | None = None) -> Status:
        return Status(READY)

    def load(self, platform=None, status: Status | None = None, verbose: bool = False) -> LoadedKernel:
        """Load this implementation (once per process)."""
        with _LOADED_LOCK:
            found = _LOADED.get(self.name)
            if found is None:
                found = _LOADED[self.name] = self._load(platform, status, verbose)
            return found

    def _load(self, platform, status: Status | None, verbose: bool) -> LoadedKernel:
        raise NotImplementedError

    def prebuild_hint(self) -> str:
        """How to have it prebuilt, for messages: opforge's ``OPFORGE_BUILD``, or the variable of
        the package it belongs to (``opforge.aot.setup_extensions``)."""
        top = self.aot_package.split(".")[0]
        if top == "opforge":
            return f"reinstall opforge with OPFORGE_BUILD={self.kind} to prebuild it"
        return f"reinstall {top} with {self.kind} prebuilt (its own build variable, see {top}'s docs)"

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} ({self.kind}, {self.backend}, priority {self.priority})>"
