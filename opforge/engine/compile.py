"""Ninja-driven compile and link of C++/CUDA sources.

``build()`` writes ``build.ninja`` into a persistent build dir and runs ninja there, so a
rebuild after an edit recompiles only the translation units whose inputs changed. Ninja
decides by mtimes; to be safe against edits that keep an old mtime (``cp -p``, some
checkouts), ``deps-state.json`` remembers the (size, mtime) of every input of every
object, and an object whose inputs moved in any direction is deleted before ninja runs.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from dataclasses import dataclass

from ..errors import BuildError
from ..files import atomic_write, write_if_changed
from .deps import parse_ninja_deps
from .flags import Flags
from .key import BuildSpec, is_cuda_file
from .ninja_file import NinjaFile, escape_value
from .progress import _Progress

NINJA_FILE = "build.ninja"
LOG_FILE = "build.log"
STATE_FILE = "deps-state.json"
_STATUS_RE = re.compile(r"^\[(\d+)/(\d+)\] ")
_ERROR_RE = re.compile(r"(\berror\b|\bError\b|undefined reference|FAILED:|fatal)", re.IGNORECASE)


@dataclass(frozen=True)
class BuildResult:
    binary: str
    log: str
    deps: dict[str, list[str]]
    """Object -> the files the compiler read for it (from ninja's deps log)."""


def object_names(sources: tuple[str, ...], with_cuda: bool) -> list[str]:
    """One object per source; names made unique when two sources share a basename.

    >>> object_names(("/a/x.cpp", "/b/x.cpp", "/a/k.cu"), True)
    ['x.o', 'x-1.o', 'k.cuda.o']
    """
    seen: dict[str, int] = {}
    names = []
    for src in sources:
        stem = os.path.splitext(os.path.basename(src))[0]
        suffix = ".cuda.o" if with_cuda and is_cuda_file(src) else ".o"
        n = seen.get(stem + suffix, 0)
        seen[stem + suffix] = n + 1
        names.append(f"{stem}{'' if n == 0 else f'-{n}'}{suffix}")
    return names


def _quote(args) -> str:
    return " ".join(shlex.quote(a) for a in args)


def write_ninja(path: str, spec: BuildSpec, flags: Flags, cxx_argv: list[str], nvcc_argv: list[str] | None,
                nvcc_gen_deps: bool, pch_header: str | None = None, pch_sources: frozenset[str] = frozenset(),
                prefix_maps: tuple[str, ...] = ()) -> dict[str, str]:
    """Write build.ninja (only when it changed, to keep ninja's state). Returns object -> source.
    Sources in ``pch_sources`` get ``-include pch_header`` (a precompiled header beside it).
    ``prefix_maps`` (``-ffile-prefix-map=...``) go to every compile, nvcc's host compiler included."""
    objects = object_names(spec.sources, spec.with_cuda)
    w = NinjaFile()
    w.variable("ninja_required_version", "1.3")
    w.variable("cxx", _quote(cxx_argv))
    w.variable("cflags", _quote(flags.cflags + prefix_maps))
    w.variable("ldflags", _quote(flags.ldflags))
    w.rule("compile", "$cxx -MMD -MF $out.d $cflags -c $in -o $out", depfile="$out.d", deps="gcc",
           description="compile $in")
    if spec.with_cuda:
        w.variable("nvcc", _quote(nvcc_argv))
        w.variable("cuda_cflags", _quote(flags.cuda_cflags + tuple(a for m in prefix_maps for a in ("-Xcompiler", m))))
        gen = "-MD -MF $out.d " if nvcc_gen_deps else ""
        w.rule("cuda_compile", f"$nvcc {gen}$cuda_cflags -c $in -o $out",
               depfile="$out.d" if nvcc_gen_deps else None, deps="gcc" if nvcc_gen_deps else None,
               description="nvcc $in")
    w.rule("link", "$cxx $in $ldflags -o $out", description="link $out")
    mapping = {}
    for src, obj in zip(spec.sources, objects):
        rule = "cuda_compile" if spec.with_cuda and is_cuda_file(src) else "compile"
        extra = None
        if pch_header and src in pch_sources:
            extra = {"cflags": f"$cflags -include {escape_value(shlex.quote(pch_header))}"}
        w.build(obj, rule, [src], variables=extra)
        mapping[obj] = src
    w.build(spec.binary_name, "link", objects)
    w.default(spec.binary_name)
    write_if_changed(path, w.text())
    return mapping


def invalidate_moved_objects(build_dir: str, source_digests: dict[str, str]) -> list[str]:
    """Delete objects whose source's bytes changed, or whose recorded inputs changed size or
    mtime in either direction, since they were built (ninja alone trusts newer mtimes)."""
    try:
        with open(os.path.join(build_dir, STATE_FILE), encoding="utf-8") as f:
            state = json.load(f)
    except (OSError, ValueError):
        return []
    removed = []
    for obj, record in state.items():
        moved = source_digests.get(record.get("source", ""), record.get("source_sha256")) != record.get("source_sha256")
        for path, size, mtime_ns in record.get("inputs", []):
            if moved:
                break
            try:
                st = os.stat(path)
                moved = st.st_size != size or st.st_mtime_ns != mtime_ns
            except OSError:
                moved = True
        if moved:
            try:
                os.unlink(os.path.join(build_dir, obj))
                removed.append(obj)
            except FileNotFoundError:
                pass
    return removed


def save_state(build_dir: str, deps: dict[str, list[str]], sources: dict[str, str],
               source_digests: dict[str, str]) -> None:
    """Remember, per object, its source's digest and the (size, mtime) of all its inputs."""
    state = {}
    for obj, inputs in deps.items():
        rows = []
        for path in inputs:
            try:
                st = os.stat(path)
                rows.append([path, st.st_size, st.st_mtime_ns])
            except OSError:
                continue
        src = sources.get(obj, "")
        state[obj] = {"source": src, "source_sha256": source_digests.get(src, ""), "inputs": rows}
    atomic_write(os.path.join(build_dir, STATE_FILE), json.dumps(state), durable=False)


def error_excerpt(log: str, max_lines: int = 25) -> str:
    """The first compiler errors in a build log, for the exception message."""
    lines = log.splitlines()
    for i, line in enumerate(lines):
        if _ERROR_RE.search(line) and not line.startswith("["):
            start = i
            # Keep the 'In file included from' / 'In function' context just above.
            while start > 0 and i - start < 4 and lines[start - 1].strip() and not lines[start - 1].startswith("["):
                start -= 1
            return "\n".join(lines[start : start + max_lines])
    return "\n".join(lines[-max_lines:])


def default_jobs() -> int:
    """Without ``MAX_JOBS``: one compile per CPU this process may run on. Ninja's own default
    (CPUs + 2) lets the longest translation unit, which ninja starts first, share a core with
    the short ones, and the cold build waits for it (measured with bias_act's CPU variant:
    docs/benchmarks.md, issue 5's build section)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return max(1, os.cpu_count() or 1)


def run_ninja(ninja: str, build_dir: str, spec: BuildSpec, objects: dict[str, str], max_jobs: int | None,
              env: dict[str, str], progress: _Progress) -> BuildResult:
    """Run ninja; return the binary and the deps, or raise BuildError with the first errors.
    ``objects`` maps each object to its source (from ``write_ninja``)."""
    log_path = os.path.join(build_dir, LOG_FILE)
    digests = dict(zip(spec.sources, spec.source_digests))
    invalidate_moved_objects(build_dir, digests)
    # keepdepfile: a failed compile's depfile stays, for the failure's record (engine/failures.py)
    cmd = [ninja, "-v", "-d", "keepdepfile", "-j", str(max_jobs or default_jobs())]
    env = dict(env, NINJA_STATUS="[%f/%t] ")
    out_lines: list[str] = []
    with open(log_path, "w", encoding="utf-8") as log, \
            subprocess.Popen(cmd, cwd=build_dir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             errors="replace", env=env) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            log.write(line)
            out_lines.append(line.rstrip("\n"))
            m = _STATUS_RE.match(line)
            if m:
                progress.step(_describe_step(line[m.end():], m.group(1), m.group(2)))
            progress.line(line.rstrip("\n"))
        rc = proc.wait()
    text = "\n".join(out_lines)
    if rc != 0:
        excerpt = error_excerpt(text)
        raise BuildError(
            f"building extension {spec.name!r} failed (ninja exit {rc}). First errors:\n{excerpt}\n"
            f"Full log: {log_path}\nNothing was cached; the next load() builds again.",
            log_path=log_path,
            excerpt=excerpt,
        )
    deps_out = subprocess.run([ninja, "-t", "deps"], cwd=build_dir, capture_output=True, text=True, env=env)
    deps = parse_ninja_deps(deps_out.stdout)
    deps = {obj: [os.path.abspath(os.path.join(build_dir, p)) for p in paths] for obj, paths in deps.items()}
    save_state(build_dir, deps, objects, digests)
    return BuildResult(os.path.join(build_dir, spec.binary_name), text, deps)


def _describe_step(command: str, done: str, total: str) -> str:
    words = command.split()
    target = next((w for w in reversed(words) if w.endswith((".cpp", ".cu", ".cc", ".cxx", ".c"))), None)
    if target is None and "-o" in words:
        target = words[words.index("-o") + 1]
    name = os.path.basename(target) if target else "…"
    return f"{done}/{total} {name}"
