"""``load()``: a drop-in for torch's, over a content-addressed cache (``load_inline``, in
``inline.py``, writes its strings to files and comes here).

Warm path (no subprocess, no ninja, no compiler; ``lookup.py``)::

    key = hash(sources' bytes, flags, toolchain identity, torch, Python, archs)
    for each entry published under the key: manifest -> stat deps -> stat binary -> import

Cold path (``build.py``, imported only then)::

    lock (flock) -> look again -> ninja in the persistent build dir -> record deps ->
    copy into a temp dir -> manifest -> rename into place -> unlock -> import
"""

from __future__ import annotations

from .. import settings as settings_mod
from ..errors import BuildError
from . import cache, importer
from .cache import Entry, Layout
from .key import BuildSpec, make_spec
from .lookup import find_entry
from .progress import Reporter

# The cold path's modules (build.py; ninja, filelock, torch's cpp_extension) are imported when a
# build starts, so that a warm load imports only what it needs.

def load(
    name,
    sources,
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
    is_standalone=False,
    keep_intermediates=True,
    *,
    source_root=None,
):
    """Build (or fetch from the cache) and load a C++/CUDA extension. Same arguments and
    return values as ``torch.utils.cpp_extension.load``:

    * ``is_python_module=True``: the imported module;
    * ``is_python_module=False``: the library is loaded into the process (for
      ``TORCH_LIBRARY`` registrations) and its path is returned;
    * ``is_standalone=True``: the path of the built executable.

    ``build_directory`` is where ninja runs (default: a persistent dir in the cache).
    ``keep_intermediates`` only matters to torch's HIP path and is accepted for compatibility.
    The parameters are torch's, in torch's order (a positional call binds as it does there);
    SYCL sources (Intel XPU) are not built: ``extra_sycl_cflags`` or ``with_sycl=True`` is an error.

    ``source_root`` (opforge's own, keyword only): the directory the key names the sources and include
    dirs relative to, so another machine with the same tree at another path finds the same binary.
    By default the common directory of the sources and their include dirs (``engine/relocate.py``).
    """
    del keep_intermediates
    check_no_sycl(name, extra_sycl_cflags, with_sycl)
    return _load(settings_mod.current(), name, sources, extra_cflags, extra_cuda_cflags, extra_ldflags,
                 extra_include_paths, build_directory, verbose, with_cuda, is_python_module, is_standalone,
                 source_root)


def check_no_sycl(name, extra_sycl_cflags=None, with_sycl=None, sycl_sources=None) -> None:
    if extra_sycl_cflags or with_sycl or sycl_sources:
        raise ValueError(f"extension {name!r}: opforge builds C++ and CUDA sources, not SYCL (Intel XPU); drop the "
                         f"SYCL arguments, or build SYCL sources with torch.utils.cpp_extension")


def _load(s: settings_mod.Settings, name, sources, extra_cflags, extra_cuda_cflags, extra_ldflags,
          extra_include_paths, build_directory, verbose, with_cuda, is_python_module, is_standalone,
          source_root=None):
    spec = make_spec(s, name, sources, extra_cflags, extra_cuda_cflags, extra_ldflags, extra_include_paths,
                     with_cuda, is_python_module, is_standalone, source_root=source_root)
    return load_spec(spec, s, build_directory, Reporter(bool(verbose) or s.verbose))


def load_spec(spec: BuildSpec, s: settings_mod.Settings, build_directory: str | None, reporter: Reporter,
              found: Entry | None = None):
    """Import ``spec``'s binary: from ``found`` (an entry ``find_entry`` returned for this spec a
    moment ago, as a loader's status holds it), else the cache's entry, else a fresh build."""
    layout = Layout(s.cache_dir)
    entry = found if found is not None else find_entry(layout, spec, reporter)
    if entry is None and s.remote_cache:
        entry = _from_remote(layout, spec, s, reporter)
    bad: list[str] = []
    if entry is not None:
        result = _import(entry, spec, reporter)
        if result is not None:
            return result
        bad.append(entry.path)
    for _ in range(_READBACK_TRIES):
        from .build import build_entry

        entry = build_entry(layout, spec, s, build_directory, reporter, bad)
        result = _import(entry, spec, reporter)
        if result is not None:
            return result
        state = cache.binary_state(entry)
        if state == "corrupt":
            break
        if state == "missing":
            bad.append(entry.path)  # removed between its publishing and its import: a cache clean ran; build again
        # "ok": gone when the import looked, published again since by another process's build: import that one
    raise BuildError(f"the freshly built {entry.binary} could not be read back; see {entry.path}/build.log")


_READBACK_TRIES = 4
"""Builds a load makes when its fresh binary is gone before it is imported (``opforge cache clean``
running meanwhile): a clean costs the loaders a rebuild, never a failed load."""


def ensure_built(spec: BuildSpec, s: settings_mod.Settings, reporter: Reporter) -> Entry:
    """Build into the cache unless a valid entry is there already; load nothing."""
    layout = Layout(s.cache_dir)
    entry = find_entry(layout, spec, reporter)
    if entry is None and s.remote_cache:
        entry = _from_remote(layout, spec, s, reporter)
    if entry is not None:
        return entry
    from .build import build_entry

    return build_entry(layout, spec, s, None, reporter, [])


def _from_remote(layout: Layout, spec: BuildSpec, s: settings_mod.Settings, reporter: Reporter) -> Entry | None:
    """The remote cache's entry for ``spec``, pulled, verified and published locally (``remote.py``)."""
    from . import remote

    return remote.fetch(layout, spec, s, reporter, lambda: find_entry(layout, spec, reporter))


def _import(entry: Entry, spec: BuildSpec, reporter: Reporter):
    """Load the entry's binary. None when it turns out to be corrupt (the caller rebuilds)."""
    path = entry.binary
    try:  # each of the importer's functions answers a binary it has loaded already at once
        if spec.is_standalone:
            return path
        if spec.is_python_module:
            return importer.import_module(spec.name, path, reporter.info)
        return importer.load_library(spec.name, path, spec.sources)
    except (ImportError, OSError):
        if cache.binary_state(entry, full_hash=True) != "ok":
            reporter.notice(f"cached binary {path} is corrupt or gone; rebuilding")
            return None
        raise


