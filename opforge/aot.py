"""Ahead-of-time builds at ``pip install``, for opforge's own kernels and other packages'.

**opforge's own kernels.** ``OPFORGE_BUILD=all`` (or a comma list of kinds and extension
names) at ``pip install`` compiles those extensions into ``opforge/_C`` with setuptools and
torch's ``BuildExtension``, and records what they were built against in
``opforge/_C/build_info.json`` (see ``prebuilt.py``).

* A kind is built whole: its variants, its companions (the extensions its variants load by
  themselves, such as block_sparse's C++ autograd node and CUDA decode kernel) and the kinds its
  loader uses (block_sparse's launches go through native_launch), so its first call compiles nothing.
* Every x86 ISA variant is built on an x86 host (explicit ``-m`` flags, never
  tuned to the build host), so one wheel runs on any x86 machine; the loader picks at run time.
* A plain ``pip install .`` builds nothing: ``setup.py`` imports this module only when
  ``OPFORGE_BUILD`` is set. (This setuptools glue sits above the engine in ``build/`` and the
  loaders' registry, whose extensions it builds.)
* torch must be importable by the build. pip's build isolation hides the installed one, so
  use ``--no-build-isolation``; without torch this module stops with a message that says so
  (we don't list torch as a build requirement: pip would fetch a multi-GB CUDA wheel into
  the isolated environment, and it might not match the torch the kernels run with).

**Other packages' kernels: opforge as the build layer of a library.** A package declares
its loaders and extensions (setting ``aot_package`` to a package of its own, such as
``"myops._C"``), and in its ``setup.py``::

    from setuptools import setup
    from opforge.aot import setup_extensions
    from myops.kernels import ScaleAddLoader

    setup(**setup_extensions([ScaleAddLoader], env="MYOPS_BUILD"))

``MYOPS_BUILD=all pip install --no-build-isolation .`` (or a comma list of kinds and
extension names) then compiles them into ``myops/_C`` with a ``build_info.json`` record; a
plain ``pip install .`` compiles nothing. At run time the loaders look there first (each
binary checked against the running torch), then in the JIT cache, then build. With an
``opforge.kernels`` entry point naming the module that declares the loaders, ``opforge
report`` and ``opforge build`` list the package's kernels too. ``examples/downstream_pkg``
is a complete example.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Iterable

from . import settings as settings_mod
from .decision import Accepted, Decision, Rejected
from .errors import OpforgeError
from .files import atomic_write
from .selection import with_used

_OFF = ("", "0", "none", "no", "off")


def torch_or_explain(request: str, var: str = "OPFORGE_BUILD"):
    try:
        import torch
    except ImportError:
        raise OpforgeError(
            f"{var}={request} builds kernels against torch, but torch can't be imported in this build "
            "environment. pip's build isolation hides the installed torch: install torch first, then run "
            f"`{var}={request} pip install --no-build-isolation .` (or `pip wheel --no-build-isolation .`)."
        ) from None
    return torch


def parse_request(request: str, extensions: dict, var: str = "OPFORGE_BUILD", uses: dict | None = None) -> list:
    """The extension classes ``OPFORGE_BUILD`` names: ``all``, or kinds and names, comma-separated.
    A kind brings the kinds its loader ``uses`` (``uses``: kind -> kinds), and ``extensions`` holds
    each kind's companions beside its variants, so ``block_sparse`` prebuilds all that its first call
    would otherwise compile.

    >>> class E:
    ...     def __init__(self, name, kind, aot=True): self.name, self.kind, self.support_aot = name, kind, aot
    >>> exts = {e.name: e for e in (E("a_avx2", "a"), E("a_torch", "a", False), E("b_cuda", "b"), E("c_cpp", "c"))}
    >>> [e.name for e in parse_request("all", exts)]
    ['a_avx2', 'b_cuda', 'c_cpp']
    >>> [e.name for e in parse_request("a, b_cuda", exts)]
    ['a_avx2', 'b_cuda']
    >>> [e.name for e in parse_request("b", exts, uses={"b": ("c",), "c": ("a",)})]
    ['a_avx2', 'b_cuda', 'c_cpp']
    >>> parse_request("d", exts)
    Traceback (most recent call last):
    ...
    ValueError: OPFORGE_BUILD: unknown kernel kind or extension 'd'. Known kinds: a, b, c; extensions: a_avx2, b_cuda, c_cpp; or 'all'
    """
    if request.strip().lower() in _OFF:
        return []
    aot = {n: e for n, e in extensions.items() if e.support_aot}
    kinds = sorted({e.kind for e in aot.values()})
    chosen: dict[str, object] = {}
    for token in (t.strip() for t in request.split(",")):
        if not token:
            continue
        if token.lower() == "all":
            chosen.update(aot)
        elif token in aot:
            chosen[token] = aot[token]
        elif token in kinds:
            for kind in with_used(token, uses or {}):
                chosen.update({n: e for n, e in aot.items() if e.kind == kind})
        else:
            raise ValueError(f"{var}: unknown kernel kind or extension {token!r}. Known kinds: "
                             f"{', '.join(kinds)}; extensions: {', '.join(sorted(aot))}; or 'all'")
    return sorted(chosen.values(), key=lambda e: e.name)


def buildable(ext, machine: str, torch_cuda: str | None, has_nvcc: bool, torch_hip: str | None = None) -> Decision:
    """Can this build host produce the extension (whatever CPU it runs on), and is it of use with this torch?"""
    if ext.backend == "cpp":
        isa = getattr(ext, "isa", None)
        if isa is not None and not isa.buildable_on(machine):
            return Rejected(f"{isa.label} code can't be built on {machine}")
        if getattr(ext, "gpu_torch_only", False) and torch_cuda is None and torch_hip is None:
            return Rejected("it drives GPU kernels, and this torch has no CUDA or ROCm")
        return Accepted()
    if ext.backend == "cuda":
        if torch_cuda is None:
            return Rejected("this torch has no CUDA")
        if not has_nvcc:
            return Rejected("nvcc not found (set CUDA_HOME)")
        return Accepted()
    return Rejected(f"a {ext.backend} extension has nothing to build")


def setup_kwargs(request: str | None = None) -> dict:
    """``ext_modules`` and ``cmdclass`` for opforge's own ``setup()``, from ``OPFORGE_BUILD``."""
    from . import prebuilt
    from .registry import loaders

    request = settings_mod.current().aot_build if request is None else request
    if request.strip().lower() in _OFF:
        return {}
    torch_or_explain(request)
    kinds = loaders().values()
    exts = {e.name: e for cls in kinds for e in (*cls.extensions(), *cls.companions())
            if e.aot_package == prebuilt.PACKAGE}
    return extension_kwargs(request, exts, "OPFORGE_BUILD", "opforge", {cls.kind: cls.uses for cls in kinds})


def extension_kwargs(request: str, extensions: dict, var: str, who: str, uses: dict | None = None) -> dict:
    """``ext_modules`` and ``cmdclass`` that build the ``extensions`` (name -> Extension) that
    ``request`` names, each into its ``aot_package``; ``var`` is the variable the request came
    from and ``who`` the package being installed (for the messages); ``uses``: the kinds each kind
    uses (``KernelLoader.uses``), built with it."""
    from .engine import toolchain

    if request.strip().lower() in _OFF:
        return {}
    torch = torch_or_explain(request, var)
    wanted = parse_request(request, extensions, var, uses)
    machine = os.uname().machine
    has_nvcc = toolchain.find_nvcc(settings_mod.current()) is not None
    modules, skipped = [], []
    for ext in wanted:
        verdict = buildable(ext, machine, torch.version.cuda, has_nvcc, getattr(torch.version, "hip", None))
        verdict = verdict and ext.bindings_decision()  # a pybind11 module would build, then offer no ops
        if verdict:
            modules.append(setuptools_extension(ext))
        else:
            skipped.append(f"{ext.name} ({verdict.reason})")
    print(f"{who}: {var}={request}: building {', '.join(m.name.split('.')[-1] for m in modules) or 'nothing'}")
    if skipped:
        print(f"{who}: not built here: {'; '.join(skipped)}")
    return {"ext_modules": modules, "cmdclass": {"build_ext": build_ext_class(extensions)}}


def setuptools_extension(ext):
    """torch's ``CppExtension``/``CUDAExtension`` for a compiled extension, named into its
    ``aot_package``, with the JIT's flags (plus the stable-ABI macro, and ``-g0``)."""
    from torch.utils import cpp_extension

    from .compat import stable_abi_macro
    from .engine import flags as flags_mod
    from .engine import toolchain

    root = os.getcwd()
    abi = [stable_abi_macro(ext.stable_abi)] if ext.stable_abi else []
    # Python's CFLAGS carry -g: 4x the wheel for symbols nobody reads
    args = {"cxx": ext.compile_flags() + abi + ["-g0"]}
    maker = cpp_extension.CppExtension
    if ext.backend == "cuda":
        args["nvcc"] = ext.cuda_compile_flags() + abi
        maker = cpp_extension.CUDAExtension
    runtime = flags_mod.runtime_ldflags(toolchain.find_cxx(settings_mod.current()))
    return maker(
        name=f"{ext.aot_package}.{ext.name}",
        sources=[os.path.relpath(p, root) for p in ext.source_paths()],
        include_dirs=ext.include_paths(),
        extra_compile_args=args,
        extra_link_args=ext.link_flags() + runtime,
        py_limited_api=bool(ext.stable_abi),
    )


def build_ext_class(extensions: dict):
    """torch's BuildExtension, timing each kernel and writing ``build_info.json`` at the end."""
    from torch.utils.cpp_extension import BuildExtension

    class OpforgeBuildExt(BuildExtension):
        def build_extension(self, ext):
            started = time.time()
            super().build_extension(ext)
            print(f"opforge: built {ext.name} in {time.time() - started:.1f} s")

        def run(self):
            super().run()
            records = {}
            out_dir = None
            for ext in self.extensions:
                name = ext.name.rsplit(".", 1)[-1]
                path = self.get_ext_fullpath(ext.name)
                out_dir = os.path.dirname(path)
                decl = extensions[name]
                with open(path, "rb") as f:
                    digest = hashlib.sha256(f.read()).hexdigest()
                records[name] = {
                    "file": os.path.basename(path),
                    "sha256": digest,
                    "kind": decl.kind,
                    "backend": decl.backend,
                    "isa": getattr(getattr(decl, "isa", None), "name", None),
                    "stable_abi": getattr(decl, "stable_abi", None),
                    "cflags": list(ext.extra_compile_args.get("cxx", [])) if isinstance(ext.extra_compile_args, dict)
                    else list(ext.extra_compile_args or []),
                }
            if out_dir is None:
                return
            write_build_info(out_dir, records)

    return OpforgeBuildExt


def write_build_info(out_dir: str, records: dict) -> None:
    from . import __version__, compat, prebuilt
    from .engine import toolchain

    cxx = toolchain.find_cxx(settings_mod.current())
    info = {
        "format": prebuilt.FORMAT,
        "opforge": __version__,
        "built_at": time.time(),
        "compiler": toolchain.probe_version(cxx.argv) if cxx else None,
        **prebuilt.info_of(compat.torch_facts()),
        "extensions": records,
    }
    path = os.path.join(out_dir, prebuilt.INFO_FILE)
    atomic_write(path, json.dumps(info, indent=1, sort_keys=True))
    print(f"opforge: recorded {len(records)} prebuilt kernels in {path}")


def setup_extensions(loaders: Iterable[type], env: str, request: str | None = None) -> dict:
    """Keyword arguments for ``setuptools.setup()`` (``ext_modules``, ``cmdclass``) that build
    the compiled extensions of ``loaders`` that ``env`` (``MYPKG_BUILD``) names; ``{}`` when it
    is unset, ``0`` or ``none``. ``request`` overrides the variable's value."""
    from .extension import CompiledExtension
    from .prebuilt import PACKAGE

    loaders = list(loaders)
    exts = {e.name: e for cls in loaders for e in (*cls.extensions(), *cls.companions())
            if isinstance(e, CompiledExtension)}
    mine = sorted(e.name for e in exts.values() if e.aot_package == PACKAGE)
    if mine:
        raise TypeError(f"{', '.join(mine)} would be prebuilt into opforge's own package ({PACKAGE}) and "
                        f"looked for there: set `aot_package = \"<yourpkg>._C\"` on your extensions")
    packages = sorted({e.aot_package for e in exts.values()})
    request = settings_mod.build_request(env) if request is None else request
    return extension_kwargs(request, exts, env, packages[0].split(".")[0] if packages else env,
                            {cls.kind: cls.uses for cls in loaders})


__all__ = ["extension_kwargs", "parse_request", "setup_extensions", "setup_kwargs"]
