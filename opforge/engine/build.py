"""The cold path of ``load()`` (``jit.py``): a build into the cache, under the entry's build lock.

    lock (flock) -> look again -> ninja in the persistent build dir -> record deps ->
    copy into a temp dir -> manifest -> rename into place -> unlock

Under torch.distributed, ranks that don't build wait for the one that does (``ranks.py``; across
nodes through the remote store, ``remote_wait.py``); a build that failed before is not retried
until its inputs change (``failures.py``); the shared precompiled header is used or made for later
(``pch_store.py``). The cold path's modules (ninja, filelock, torch's cpp_extension) are imported
when a build starts, so that a warm load imports none of them, nor this module.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import time

from .. import settings as settings_mod
from ..errors import BuildError
from . import cache, failures, ranks, toolchain
from . import deps as deps_mod
from .cache import Entry, Layout
from .key import BuildSpec, is_cuda_file
from .lookup import find_entry
from .manifest import Manifest
from .progress import Reporter


def build_entry(layout: Layout, spec: BuildSpec, s: settings_mod.Settings, build_directory: str | None,
                reporter: Reporter, bad: list[str]) -> Entry:
    """The cold path, under the build lock: the entry another process published meanwhile, else
    another rank's build waited for, else this process's own. ``bad``: entries that failed to import."""
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
