"""``load_inline()``: torch's ``load_inline`` over opforge's ``load``: the source strings (and
the pybind11 bindings generated for ``functions``) become files in a content-addressed
directory of the cache (or ``build_directory``), which ``jit`` then builds and loads as any.

In the cache, the directory (``<name>/.src-<digest>/``) is a leftover that ``opforge cache clean``
removes. While a process writes the files and loads from them, it holds a shared ``flock`` on
``<dir>.lock`` (:func:`_using`); clean removes the dir only when it gets that lock exclusively, at once
(``inventory.discard_if_idle``), so it never removes sources a load is about to hash or compile, and
a load that comes during a removal waits for it, then writes the files again."""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os

from .. import settings as settings_mod
from ..files import write_if_changed
from . import cache
from .cache import Layout
from .jit import _load, check_no_sycl
from .key import check_name


def load_inline(
    name,
    cpp_sources,
    cuda_sources=None,
    sycl_sources=None,
    functions=None,
    extra_cflags=None,
    extra_cuda_cflags=None,
    extra_sycl_cflags=None,
    extra_ldflags=None,
    extra_include_paths=None,
    build_directory=None,
    verbose=False,
    with_cuda=None,
    with_sycl=None,
    is_python_module=True,
    with_pytorch_error_handling=True,
    keep_intermediates=True,
    use_pch=False,
    no_implicit_headers=False,
):
    """Like ``torch.utils.cpp_extension.load_inline``: sources as strings, optional
    pybind11 bindings generated for ``functions``. The generated files live in a
    content-addressed directory of the cache (or in ``build_directory``). torch's parameters,
    in torch's order; ``use_pch=True`` precompiles ``torch/extension.h`` before this build when it is not
    there yet, even where ``OPFORGE_PCH=0`` (shared by every build with the same compiler and flags); SYCL sources are not built (an error)."""
    check_name(name)
    check_no_sycl(name, extra_sycl_cflags, with_sycl, sycl_sources)
    s = settings_mod.current()
    if use_pch:  # as torch's use_pch: made before this build, when missing
        s = dataclasses.replace(s, pch_mode="eager")
    cpp_list = [cpp_sources] if isinstance(cpp_sources, str) else list(cpp_sources or [])
    cuda_list = [cuda_sources] if isinstance(cuda_sources, str) else list(cuda_sources or [])
    if not cpp_list and not cuda_list:
        raise ValueError(f"extension {name!r}: cpp_sources is empty; pass the C++ source text")
    if not no_implicit_headers:
        cpp_list.insert(0, "#include <torch/extension.h>")
    if functions is not None:
        if isinstance(functions, str):
            functions = [functions]
        if isinstance(functions, (list, tuple)):
            functions = {f: f for f in functions}
        if not isinstance(functions, dict):
            raise ValueError(f"'functions' must be a list or dict of function names, not {type(functions).__name__}")
        defs = ["PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {"]
        for fn, doc in functions.items():
            wrapped = f"torch::wrap_pybind_function({fn})" if with_pytorch_error_handling else fn
            defs.append(f'm.def("{fn}", {wrapped}, "{doc}");')
        defs.append("}")
        cpp_list += defs
    files = {"main.cpp": "\n".join(cpp_list)}
    if cuda_list:
        if not no_implicit_headers:
            cuda_list[:0] = ["#include <torch/types.h>", "#include <cuda.h>", "#include <cuda_runtime.h>"]
        files["cuda.cu"] = "\n".join(cuda_list)

    if build_directory:
        src_dir = os.path.abspath(build_directory)
        using = contextlib.nullcontext()  # the user's dir: nobody else removes it
    else:
        from .key import digest

        layout = Layout(s.cache_dir)
        cache.ensure_dir(layout.root, layout.root)
        cache.ensure_dir(layout.name_dir(name), layout.root)
        src_dir = os.path.join(layout.name_dir(name), ".src-" + digest(files)[:16])
        using = _using(src_dir)
    with using:
        os.makedirs(src_dir, mode=0o700, exist_ok=True)
        paths = []
        for fname, text in files.items():
            path = os.path.join(src_dir, fname)
            write_if_changed(path, text)
            paths.append(path)
        return _load(s, name, paths, extra_cflags, extra_cuda_cflags, extra_ldflags, extra_include_paths,
                     build_directory, verbose, with_cuda, is_python_module, False)


@contextlib.contextmanager
def _using(src_dir: str):
    """A shared ``flock`` on ``<src_dir>.lock`` for the block: any number of loads share it; ``opforge cache
    clean`` must take it exclusively to remove ``src_dir``. The kernel drops it if this process dies. In a
    cache this process can't write (a read-only mount), there is no lock to take, and no clean to fear."""
    try:
        fd = os.open(src_dir + ".lock", os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError:
        fd = None
    if fd is None:
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)  # waits only while a clean removes the dir (a non-blocking taker)
        yield
    finally:
        os.close(fd)



