"""``load()``: a drop-in for torch's, over a content-addressed cache (``load_inline``, in
``inline.py``, writes its strings to files and comes here).

Warm path (no subprocess, no ninja, no compiler)::

    key = hash(sources' bytes, flags, toolchain identity, torch, Python, archs)
    for each entry published under the key: manifest -> stat deps -> stat binary -> import

Cold path::

    lock (flock) -> look again -> ninja in the persistent build dir -> record deps ->
    copy into a temp dir -> manifest -> rename into place -> unlock -> import
"""

from __future__ import annotations

import dataclasses
import os
import socket
import time

from .. import settings as settings_mod
from ..errors import BuildError
from . import cache, failures, importer, ranks, toolchain
from . import deps as deps_mod
from .cache import Entry, Layout
from .key import BuildSpec, is_cuda_file, make_spec
from .manifest import Manifest
from .progress import Reporter

# The cold path's modules (ninja, filelock, torch's cpp_extension) are imported when a
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
        entry = _build(layout, spec, s, build_directory, reporter, bad)
        result = _import(entry, spec, reporter)
        if result is not None:
            return result
        if cache.binary_state(entry) != "missing":
            break
        bad.append(entry.path)  # removed between its publishing and its import: a cache clean ran; build again
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
    return entry or _build(layout, spec, s, None, reporter, [])


def _from_remote(layout: Layout, spec: BuildSpec, s: settings_mod.Settings, reporter: Reporter) -> Entry | None:
    """The remote cache's entry for ``spec``, pulled, verified and published locally (``remote.py``)."""
    from . import remote

    return remote.fetch(layout, spec, s, reporter, lambda: find_entry(layout, spec, reporter))


def find_entry(layout: Layout, spec: BuildSpec, reporter: Reporter, corrupt: list | None = None) -> Entry | None:
    """The warm path: a published entry whose recorded inputs all still hold, else None."""
    if spec.toolchain_missing:
        candidates = _portable_candidates(layout, spec)
    else:
        candidates = layout.candidates(spec.name, spec.input_key)
    if not candidates:
        return None
    try:
        cache.check_safe(layout.name_dir(spec.name))
    except FileNotFoundError:
        return None
    for path in candidates:
        manifest = cache.read_manifest(path)
        if manifest is None:
            reporter.notice(f"cache entry {path} has a missing or corrupt manifest; rebuilding")
            if corrupt is not None:
                corrupt.append(path)
            continue
        if not spec.toolchain_missing and manifest.key != spec.input_key:
            continue
        entry = Entry(path, manifest)
        # The sources' bytes are in the key already: only the headers need a look (under this spec's root).
        changed = deps_mod.check((r for r in entry.deps if r.path not in spec.key_sources), spec.places)
        if changed:
            reporter.info(f"{path} is stale: {', '.join(changed[:3])} changed")
            continue
        try:
            cache.check_safe(path)
        except FileNotFoundError:
            continue  # removed since the scan (`opforge cache clean`): as if never found
        state = cache.binary_state(entry)
        if state != "ok":
            why = "corrupt (sha256 mismatch with its manifest)" if state == "corrupt" else "missing"
            reporter.notice(f"cached binary {entry.binary} is {why}; rebuilding")
            if corrupt is not None:
                corrupt.append(path)
            continue
        from .usage import note_use  # a stat, and a utime once a day (OPFORGE_CACHE_MAX_SIZE's LRU)

        note_use(entry)
        return entry
    return None


def _portable_candidates(layout: Layout, spec: BuildSpec) -> list[str]:
    """With no compiler here, entries built elsewhere for the same inputs (any toolchain)."""
    name_dir = layout.name_dir(spec.name)
    try:
        names = [n for n in os.listdir(name_dir) if not n.startswith(".")]
    except OSError:
        return []
    wanted = spec.portable_key
    found = []
    for n in names:
        m = cache.read_manifest(os.path.join(name_dir, n))
        if m is not None and m.portable_key == wanted:
            found.append((m.built_at, os.path.join(name_dir, n)))
    return [p for _, p in sorted(found, reverse=True)]


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


def _build(layout: Layout, spec: BuildSpec, s: settings_mod.Settings, build_directory: str | None,
           reporter: Reporter, bad: list[str]) -> Entry:
    """The cold path, under the build lock."""
    from .lock import BuildLock

    if spec.toolchain_missing and ranks.role(s).builds:
        toolchain.cxx(s)  # fail fast, naming CXX; a rank that waits for a builder needs no compiler
    name_dir = layout.name_dir(spec.name)
    cache.ensure_dir(layout.root, layout.root)
    cache.ensure_dir(name_dir, layout.root)
    cache.check_safe(name_dir)
    if build_directory:
        build_dir = os.path.abspath(build_directory)
        lock_path = os.path.join(build_dir, ".opforge.lock")
        os.makedirs(build_dir, mode=0o700, exist_ok=True)
    else:
        build_dir = layout.build_dir(spec.name, spec.config_key)
        lock_path = layout.lock_path(spec.name, spec.config_key)
    role = ranks.role(s)
    failed = failures.path_for(name_dir, spec.input_key)
    if not role.builds and not bad:
        find = lambda: find_entry(layout, spec, reporter)  # noqa: E731
        store = None
        if role.scope == "remote":  # the builder may be on another node: one rank per node polls the store
            from . import remote_push, remote_wait

            store = remote_wait.Watch(layout, spec, s, reporter, find)
        entry = ranks.await_builder(find, lock_path, failed, spec.name, role, s, reporter, store)
        if entry is not None:
            return entry
        if store is not None:  # the builder's part moved here: announce (the claim won), build, push
            role = dataclasses.replace(role, builds=True)
    cxx = toolchain.cxx(s)  # raises a ToolchainError that names CXX when there is no compiler
    nvcc = toolchain.nvcc(s) if spec.with_cuda else None  # likewise, naming CUDA_HOME
    if nvcc is not None:  # another CUDA major than torch's: a ToolchainError, as torch's own JIT refuses it
        toolchain.check_cuda(nvcc, spec.torch.cuda, reporter.notice)
    ninja = toolchain.ninja()
    with BuildLock(lock_path, spec.name, s.lock_timeout, reporter.notice) as lock:
        for path in bad:  # failed to import although its stat matched: corrupt in place
            cache.discard(path)
        corrupt: list[str] = []
        entry = find_entry(layout, spec, reporter, corrupt)
        if entry is not None:
            return entry  # another process built it while we waited
        for path in corrupt:
            cache.discard(path)
        if lock.previous is not None:
            reporter.notice(
                f"the previous build of {spec.name} (pid {lock.previous.pid} on {lock.previous.host}) "
                "was interrupted; building from a clean build directory"
            )
            _clean_build_dir(build_dir, own=not build_directory)
        cache.sweep_stale(name_dir)
        cache.ensure_dir(build_dir, layout.root)
        withdraw = lambda: None  # noqa: E731
        if role.scope == "remote" and role.builds:  # say so in the store: other nodes wait for the push
            from . import remote_push, remote_wait

            withdraw = remote_wait.announce(spec, s, reporter)
        try:
            entry, pch_plan = _compile_and_publish(layout, spec, s, cxx, nvcc, ninja, build_dir, reporter)
        except BuildError as exc:
            failures.record(failed, exc, _inputs_read(spec, s, build_dir, ninja))
            withdraw()
            raise
        except OSError as exc:  # writing the build files (a full disk, a read-only cache)
            withdraw()
            raise cache.write_error(f"build {spec.name}", build_dir, layout.root, exc) from exc
        failures.forget(failed)  # an earlier failure of these inputs is history now
    if pch_plan is not None and pch_plan.make_after:  # for later builds with these flags, at the lowest priority
        from . import pch_store

        pch_store.start_background(pch_plan.pch, s.pch_cap, reporter)
    if s.remote_cache and s.remote_push:  # outside the lock: this node's waiting processes load meanwhile
        from . import remote_push, remote_wait

        remote_push.push(entry, s, reporter)
    withdraw()
    from . import budget

    budget.enforce(layout.root, s.cache_max_size, reporter, keep=(entry.path,))  # never raises
    return entry


def _inputs_read(spec: BuildSpec, s: settings_mod.Settings, build_dir: str, ninja: str) -> list:
    """What a failed build read, outside what the key covers (see ``failures.inputs_of``)."""
    from . import flags as flags_mod

    system = flags_mod.system_prefixes(spec, toolchain.cuda_home(s) if spec.with_cuda else None)
    return failures.inputs_of(spec.sources, spec.extra_include_paths, build_dir, ninja, system)


def _clean_build_dir(build_dir: str, own: bool) -> None:
    from . import compile as compile_mod

    if own:
        cache.discard(build_dir)
        return
    # A user's build_directory: remove only what ninja and opforge put there.
    for n in (".ninja_log", ".ninja_deps", compile_mod.NINJA_FILE, compile_mod.STATE_FILE):
        try:
            os.unlink(os.path.join(build_dir, n))
        except FileNotFoundError:
            pass


def _compiler_env(ccache: str | None, pch_header: str | None) -> dict[str, str]:
    """The compilers' environment. With ccache and the shared PCH both in use, ccache is told what its
    manual asks for PCH builds (``sloppiness=pch_defines,time_macros``; the PCH is ``-include``d by its
    full path), else it would pass every such compile through uncached."""
    env = settings_mod.subprocess_env()
    if ccache and pch_header and os.path.basename(ccache).startswith("ccache"):
        have = [x for x in env.get("CCACHE_SLOPPINESS", "").split(",") if x]
        env["CCACHE_SLOPPINESS"] = ",".join(dict.fromkeys([*have, "pch_defines", "time_macros"]))
    return env


def _compile_and_publish(layout: Layout, spec: BuildSpec, s: settings_mod.Settings, cxx: toolchain.Tool,
                         nvcc: toolchain.Tool | None, ninja: str, build_dir: str, reporter: Reporter):
    """Build and publish; returns the entry and the build's PCH plan (None without one)."""
    from . import compile as compile_mod
    from . import flags as flags_mod

    home = toolchain.cuda_home(s) if spec.with_cuda else None
    flags = flags_mod.derive(spec, s)
    ccache = toolchain.ccache(s)
    wrap = [ccache] if ccache else []
    cxx_argv = wrap + list(cxx.argv)
    nvcc_argv = wrap + list(nvcc.argv) if nvcc else None
    pch_plan = _pch_plan(layout, spec, s, cxx, cxx_argv, flags.cflags, reporter)
    pch_header = pch_plan.use if pch_plan else None
    # The binary doesn't record where it was built: this machine's dirs are mapped away (relocate.py).
    maps = spec.places.prefix_maps(build_dir) if toolchain.accepts_prefix_map(cxx.argv, cxx.identity) else []
    objects = compile_mod.write_ninja(os.path.join(build_dir, compile_mod.NINJA_FILE), spec, flags, cxx_argv,
                                      nvcc_argv, s.nvcc_gen_deps, pch_header,
                                      pch_plan.sources if pch_plan else frozenset(), tuple(maps))
    started = time.time()
    with reporter.building(spec.name, len(spec.sources)) as progress:
        result = compile_mod.run_ninja(ninja, build_dir, spec, objects, s.max_jobs,
                                       _compiler_env(ccache, pch_header), progress)
    took = time.time() - started

    # What the binary was built from: the sources, plus every header the compiler read
    # outside torch, Python, CUDA and the OS (those are covered by the key).
    system = flags_mod.system_prefixes(spec, home) + [os.path.join(layout.root, ".pch")]
    paths = dict.fromkeys(spec.sources)
    for obj_inputs in result.deps.values():
        for p in obj_inputs:
            if not deps_mod.is_system_path(p, system):
                paths[p] = None
    records = [deps_mod.DepRecord.of(p) for p in paths]
    for rec, digest in zip(records, spec.source_digests):
        if rec.sha256 != digest:
            raise BuildError(f"{rec.path} changed while {spec.name} was building; nothing was cached. Load again.")
    # Under the source root by their relative path, so that another node's copy at another path matches.
    records = [dataclasses.replace(r, path=spec.places.path(r.path)) for r in records]
    headers = deps_mod.headers_digest(records, spec.key_sources)
    manifest = Manifest(
        name=spec.name,
        kind=spec.kind,
        key=spec.input_key,
        portable_key=spec.portable_key,
        config_key=spec.config_key,
        headers_digest=headers,
        deps=tuple(records),
        inputs=spec.describe(),
        flags={"cflags": flags.cflags, "cuda_cflags": flags.cuda_cflags, "ldflags": flags.ldflags},
        compiler=toolchain.probe_version(cxx.argv),
        nvcc=toolchain.probe_version(nvcc.argv) if nvcc else None,
        ccache=ccache,
        torch=spec.torch.version,
        cuda=spec.torch.cuda,
        built_at=time.time(),
        build_seconds=round(took, 3),
        host=socket.gethostname(),
        root=spec.root,
    )
    entry = cache.publish(layout, spec.name, spec.input_key, headers, result.binary, spec.binary_name, manifest,
                          result.log)
    reporter.info(f"cached {spec.name} at {entry.path}")
    return entry, pch_plan


def _pch_plan(layout: Layout, spec: BuildSpec, s: settings_mod.Settings, cxx: toolchain.Tool, cxx_argv: list[str],
              cflags, reporter: Reporter):
    """The shared precompiled header's part in this build (``pch_store.plan``), or None: off, GCC not the
    compiler, or no source that can use one."""
    if s.pch_mode == "off":
        return None
    from . import pch, pch_store

    sources = frozenset(src for src in spec.sources if not (spec.with_cuda and is_cuda_file(src))
                        and pch.eligible(src, spec.extra_include_paths))
    if not sources:
        return None
    if not pch.is_gcc(tuple(cxx.argv)):
        reporter.info("the compiler is not GCC; building without a precompiled torch/extension.h")
        return None
    store = pch_store.describe(layout.root, cxx.identity, cxx_argv, cflags, repr(spec.torch.as_tuple()))
    return pch_store.plan(store, s.pch_mode, s.pch_cap, s.lock_timeout, reporter, sources)
