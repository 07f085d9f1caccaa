"""What a library asks of ``torch.utils.cpp_extension`` at a warm start, answered without its import.

torch's module costs 0.14 s to import here and 0.40-0.49 s on the H200 host by the issue's measure (setuptools, Cython through
setuptools' ``build_ext``, ``_distutils_hack``; ``torch.cuda.is_available()`` for ``CUDA_HOME``'s warning),
and a library calls it for a few values before its op is loaded: DeepSpeed reads ``CUDA_HOME`` and calls
``verify_ninja_availability()`` before ``load``; StyleGAN's plugins ``_get_build_directory``. Under the patch
the module is a stand-in (``stand_in.py``) that gives these answers itself, computed as torch's own code
computes them, with torch's own helpers where they are cheap (``torch._appdirs``), and goes to torch's module
for anything else.

The answers follow torch's code of the versions in :data:`CHECKED` (tests/engine/test_patch_stand_in.py
compares each with the real module's on the torch it runs on); for another torch, or a ROCm one, the patch
imports the real module as before (:func:`offered`). One answer is cheaper than torch's on purpose:
``is_ninja_available()`` looks ``ninja`` up on ``PATH`` where torch runs ``ninja --version`` (the same answer
unless the binary found is broken).
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import logging
import os
import shutil
import sys

from ..compat import version_tuple
from ..settings import Settings

CHECKED = ((2, 11), (2, 15))
"""The torch versions, [first, last), whose ``cpp_extension`` these answers follow."""

NAMES = ("load", "load_inline", "_import_module_from_library", "CUDA_HOME", "ROCM_HOME", "include_paths",
         "library_paths", "is_ninja_available", "verify_ninja_availability", "_get_build_directory")
"""The names the stand-in answers (``load`` and ``load_inline`` are the patch's routed functions)."""

LOGGER = "torch.utils.cpp_extension"


def offered(torch) -> str:
    """Why the stand-in can't answer for this torch ("" when it can).

    >>> import types
    >>> v = types.SimpleNamespace(cuda=None, hip=None)
    >>> offered(types.SimpleNamespace(__version__="2.13.0+cpu", version=v)), offered(types.SimpleNamespace(
    ...     __version__="2.9.1", version=v))
    ('', 'torch 2.9.1 is outside the versions whose torch.utils.cpp_extension the stand-in follows (2.11 to 2.14)')
    """
    if getattr(torch.version, "hip", None):
        return f"a ROCm torch (HIP {torch.version.hip})"
    found = version_tuple(str(torch.__version__))[:2]
    if not CHECKED[0] <= found < CHECKED[1]:
        last = (CHECKED[1][0], CHECKED[1][1] - 1)
        return (f"torch {torch.__version__} is outside the versions whose torch.utils.cpp_extension the stand-in "
                f"follows ({CHECKED[0][0]}.{CHECKED[0][1]} to {last[0]}.{last[1]})")
    return ""


def user_cache_dir(appname: str, xdg_cache_home: str | None) -> str:
    """``torch._appdirs.user_cache_dir(appname=...)`` (torch's private copy of appdirs) where torch has it; else what
    it gives on Linux, ``$XDG_CACHE_HOME`` (``xdg_cache_home``) or ``~/.cache``, then the name (a test compares them)."""
    try:
        from torch import _appdirs
    except ImportError:
        return linux_cache_dir(appname, xdg_cache_home)
    return _appdirs.user_cache_dir(appname=appname)


def linux_cache_dir(appname: str, xdg_cache_home: str | None) -> str:
    return os.path.join(xdg_cache_home or os.path.expanduser("~/.cache"), appname)


class Answers:
    """torch's answers for a module file at ``origin`` (``.../torch/utils/cpp_extension.py``), under the
    environment of ``settings`` (read when the module is imported, as torch reads its constants then),
    ``gpus_visible()`` saying whether CUDA would find a GPU (for ``CUDA_HOME``'s warning, which torch gives
    after asking ``torch.cuda.is_available()``)."""

    def __init__(self, torch, origin: str, settings: Settings, gpus_visible):
        self.torch = torch
        self.settings = settings
        self.env = settings.torch_env
        self._gpus_visible = gpus_visible
        self.torch_path = os.path.dirname(os.path.dirname(os.path.abspath(origin)))
        self.cudnn_home = self.env.cudnn_home or self.env.cudnn_path

    # -- the constants (computed on first use, then kept as torch keeps them) --

    def cuda_home(self) -> str | None:
        if not self.torch.version.cuda:  # torch's test, torch.cuda._is_compiled() and version.cuda: a CUDA build
            return None
        home = self.env.cuda_home or self.env.cuda_path
        if home is None:
            nvcc = shutil.which("nvcc", path=self.settings.path)
            if nvcc is not None:
                home = os.path.dirname(os.path.dirname(nvcc))
            else:
                home = "/usr/local/cuda"
                if not os.path.exists(home):
                    home = None
        if home and not self._gpus_visible():
            logging.getLogger(LOGGER).warning("No CUDA runtime is found, using CUDA_HOME='%s'", home)
        return home

    def rocm_home(self) -> str | None:
        return None  # a ROCm torch is not offered the stand-in (``offered``): torch's is None for the others

    # -- the functions --

    def join_cuda_home(self, cuda_home: str | None, *paths: str) -> str:
        if cuda_home is None:
            raise OSError("CUDA_HOME environment variable is not set. Please set it to your CUDA install root.")
        return os.path.join(cuda_home, *paths)

    def include_paths(self, cuda_home: str | None, device_type: str = "cpu", torch_include_dirs=True) -> list[str]:
        paths = []
        lib_include = os.path.join(self.torch_path, "include")
        if torch_include_dirs:
            paths.extend([lib_include, os.path.join(lib_include, "torch", "csrc", "api", "include")])
        if device_type == "cuda":
            cuda_home_include = self.join_cuda_home(cuda_home, "include")
            if cuda_home_include != "/usr/include":
                paths.append(cuda_home_include)
            cuda_inc_path = self.env.cuda_inc_path
            if cuda_inc_path and cuda_inc_path != "/usr/include":
                paths.append(cuda_inc_path)
            if self.cudnn_home is not None:
                paths.append(os.path.join(self.cudnn_home, "include"))
        return paths

    def library_paths(self, cuda_home: str | None, device_type: str = "cpu", torch_include_dirs: bool = True) -> list[str]:
        paths = []
        if torch_include_dirs:
            paths.append(os.path.join(self.torch_path, "lib"))
        if device_type == "cuda":
            lib_dir = "lib64"
            if (not os.path.exists(self.join_cuda_home(cuda_home, lib_dir))
                    and os.path.exists(self.join_cuda_home(cuda_home, "lib"))):
                lib_dir = "lib"
            paths.append(self.join_cuda_home(cuda_home, lib_dir))
            if self.cudnn_home is not None:
                paths.append(os.path.join(self.cudnn_home, lib_dir))
        return paths

    def is_ninja_available(self) -> bool:
        return shutil.which("ninja", path=self.settings.path) is not None

    def verify_ninja_availability(self) -> None:
        if not self.is_ninja_available():
            raise RuntimeError("Ninja is required to load C++ extensions (pip install ninja to get it)")

    def get_build_directory(self, name: str, verbose: bool) -> str:
        torch = self.torch
        root = self.env.extensions_dir
        if root is None:
            root = os.path.realpath(user_cache_dir("torch_extensions", self.env.xdg_cache_home))
            accelerator = f"cu{torch.version.cuda.replace('.', '')}" if torch.version.cuda is not None else "cpu"
            python_version = f"py{sys.version_info.major}{sys.version_info.minor}{getattr(sys, 'abiflags', '')}"
            root = os.path.join(root, f"{python_version}_{accelerator}")
        log = logging.getLogger(LOGGER)
        if verbose:
            log.info("Using %s as PyTorch extensions root...", root)
        build_directory = os.path.join(root, name)
        if not os.path.exists(build_directory):
            if verbose:
                log.debug("Creating extension directory %s...", build_directory)
            os.makedirs(build_directory, exist_ok=True)
        return build_directory

    def import_module_from_library(self, module_name, path, is_python_module):
        filepath = os.path.join(path, f"{module_name}.so")
        if is_python_module:
            spec = importlib.util.spec_from_file_location(module_name, filepath)
            if spec is None:
                raise AssertionError(f"Failed to create spec for module {module_name} at {filepath}")
            module = importlib.util.module_from_spec(spec)
            if not isinstance(spec.loader, importlib.abc.Loader):
                raise AssertionError("spec.loader is not a valid importlib Loader")
            spec.loader.exec_module(module)
            return module
        self.torch.ops.load_library(filepath)
        return filepath


__all__ = ["CHECKED", "LOGGER", "NAMES", "Answers", "linux_cache_dir", "offered", "user_cache_dir"]
