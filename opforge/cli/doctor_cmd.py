"""``opforge doctor [--json] [--no-build]``: the checks users trip on, each with a fix.

Each check has a ``status``: ``ok``, ``warn`` (something is off, but builds and loads can
go on: a fallback is used) or ``fail`` (something blocks a build or a load). The exit code
is 1 when any check fails, else 0.

The checks, in order:

* ``c++ compiler``: found, and its version runs (fail when missing).
* ``ninja``: found (fail when missing).
* ``cuda``: only when torch is built with CUDA: nvcc found (fail when a GPU is visible,
  else warn) and nvcc's CUDA major equal to torch's (fail); a CPU build of torch gets one
  ``ok`` line saying the CUDA checks do not apply.
* ``cache dir``: the cache root can be created and written, and is safe (not a symlink,
  owned by you, not writable by group or others).
* ``prebuilt <name>``: each kernel built at ``pip install``: its file is there and its
  sha256 matches the record (fail), and it may run under this torch (warn).
* ``remote cache``, ``trusted keys``, ``signing key``: only with ``OPFORGE_REMOTE_CACHE`` set (else one
  ``ok`` line): the URL is usable (``file://relative`` fails), the store's root is there (fail:
  ``missing``) and answers within ``OPFORGE_REMOTE_TIMEOUT``; the trusted and signing keys can be read
  (``remote_cmd.check_remote``).
* ``patch torch``: ``OPFORGE_PATCH_TORCH`` on or off, and whether opforge's startup hook is installed
  in this Python, so that the variable alone patches torch (warn when it is on and the hook is not
  there; ``doctor_patch.py``).
* ``trial build`` (not with ``--no-build``): build the selftest kernel's best C++ variant
  into the JIT cache, load it in a child process and check ``axpy`` against torch.

The check functions take their inputs (a :class:`~opforge.platform.Platform`, a
:class:`~opforge.settings.Settings`, a :class:`~opforge.prebuilt.Prebuilt`) as arguments
and return :class:`Check` objects; they print nothing, so tests call them with inputs
built by hand.

JSON schema ``opforge.doctor/1``:

* ``schema`` (str): ``"opforge.doctor/1"``.
* ``opforge`` (str): the opforge version.
* ``ok`` (bool): no check failed (the exit code is 0).
* ``checks`` (list of objects), in the order above:

  - ``name`` (str): e.g. ``c++ compiler``, ``prebuilt selftest_avx2``;
  - ``status`` (str): ``ok``, ``warn`` or ``fail``;
  - ``detail`` (str): what was found;
  - ``fix`` (str): what to do about it; empty when the status is ``ok``.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import tempfile
import time

from .. import __version__, compat
from .. import prebuilt as prebuilt_mod
from .. import settings as settings_mod
from ..errors import BuildError, CacheError, OpforgeError, UnsafeCacheError
from ..extension import CACHED
from ..platform import Platform
from . import doctor_patch, remote_cmd
from .doctor_checks import FAIL, OK, WARN, Check

SCHEMA = "opforge.doctor/1"
def add_parser(sub) -> None:
    p = sub.add_parser("doctor", help="check that this machine can build and load opforge kernels")
    p.add_argument("--json", action="store_true", help=f"print JSON (schema {SCHEMA}) instead of a table")
    p.add_argument("--no-build", action="store_true", help="skip the trial build of the selftest kernel")
    p.set_defaults(func=cmd_doctor)


# -- the checks (no printing) -------------------------------------------------------------


def check_cxx(platform: Platform, settings: settings_mod.Settings) -> Check:
    name = "c++ compiler"
    if platform.cxx is None:
        if settings.cxx:
            return Check(name, FAIL, f"CXX={settings.cxx!r} does not name a compiler on PATH",
                         "point CXX at a C++ compiler (e.g. CXX=/usr/bin/g++), or unset it to use c++")
        return Check(name, FAIL, "no C++ compiler: `c++` is not on PATH",
                     "install one (e.g. `apt-get install g++`), or set CXX to a compiler")
    if not platform.cxx.version:
        return Check(name, WARN, f"{platform.cxx.path} was found, but `{platform.cxx.path} --version` failed",
                     "check that the compiler runs; or set CXX to another compiler")
    return Check(name, OK, f"{platform.cxx.path}: {platform.cxx.version}")


def check_ninja(platform: Platform) -> Check:
    if platform.ninja is None:
        return Check("ninja", FAIL, "ninja not found (neither the `ninja` Python package nor one on PATH)",
                     "`pip install ninja`")
    return Check("ninja", OK, f"{platform.ninja.path}: {platform.ninja.version or 'version unknown'}")


def check_cuda(platform: Platform, settings: settings_mod.Settings) -> list[Check]:
    """nvcc, and its CUDA version against torch's. Only relevant when torch has CUDA."""
    if platform.torch_cuda is None:
        return [Check("cuda", OK, f"not needed: torch {platform.torch_version} is built without CUDA")]
    toolkit = f"a CUDA {(compat.version_numbers(platform.torch_cuda) or ('?',))[0]}.x toolkit"
    if platform.nvcc is None:
        where = (f"CUDA_HOME={settings.cuda_home} has no bin/nvcc" if settings.cuda_home
                 else "no CUDA toolkit found (CUDA_HOME unset, no nvcc on PATH, no /usr/local/cuda)")
        if settings.pytorch_nvcc:
            where = f"PYTORCH_NVCC={settings.pytorch_nvcc!r} is not an executable"
        gpu = platform.has_cuda_gpu
        return [Check("nvcc", FAIL if gpu else WARN,
                      f"nvcc not found: {where}" + ("" if gpu else "; no NVIDIA GPU is visible, so CUDA kernels "
                                                                    "are not used here anyway"),
                      f"install {toolkit} and set CUDA_HOME to it (e.g. CUDA_HOME=/usr/local/cuda-"
                      f"{platform.torch_cuda})")]
    version = platform.nvcc.version_tuple
    if not version:
        return [Check("nvcc", WARN, f"{platform.nvcc.path}: could not read its CUDA version",
                      f"check that `{platform.nvcc.path} --version` runs; torch needs {toolkit}")]
    nvcc_cuda = ".".join(map(str, version[:2]))
    verdict = compat.cuda_major(version, platform.torch_cuda, platform.nvcc.path)
    if not verdict:
        return [Check("nvcc", FAIL, verdict.reason,
                      f"set CUDA_HOME to {toolkit} (e.g. CUDA_HOME=/usr/local/cuda-{platform.torch_cuda}), "
                      f"or install a torch built for CUDA {version[0]}")]
    return [Check("nvcc", OK, f"{platform.nvcc.path}: CUDA {nvcc_cuda}, torch has CUDA {platform.torch_cuda}"
                  + (" (a minor-version difference, which torch accepts)" if verdict.reason else ""))]


def _unsafe_fix(path: str, elsewhere: str) -> str:
    """The fix for a path ``cache.check_safe`` refused."""
    try:
        st = os.lstat(path)
    except OSError:
        return elsewhere
    if stat.S_ISLNK(st.st_mode):
        return f"remove the link (`rm {path}`): opforge recreates it; or {elsewhere}"
    if st.st_uid != os.geteuid():
        return f"{elsewhere}, or have its owner remove {path}"
    return f"`chmod 700 {path}`, or {elsewhere}"


def check_cache(settings: settings_mod.Settings) -> Check:
    """The cache root can be created and written, and it and each kernel's dir in it are safe
    (``cache.check_safe``: not a link, yours, not writable by group or others). The root may be
    a symlink (``~/.cache`` often is): its target is checked."""
    from ..engine import cache

    name = "cache dir"
    root = settings.cache_dir
    elsewhere = ("set OPFORGE_CACHE_DIR to a directory of your own" if not settings.cache_dir_from_env
                 else "point OPFORGE_CACHE_DIR at a directory of your own")
    path = root
    try:
        cache.ensure_dir(root, root)
        real = os.path.realpath(root)
        path = real
        cache.check_safe(real)
        with os.scandir(real) as it:
            kernel_dirs = sorted(e.path for e in it if not e.name.startswith(".") and e.is_dir(follow_symlinks=False))
        for path in kernel_dirs:
            cache.check_safe(path)
        path = real
        fd, probe = tempfile.mkstemp(prefix=".doctor-", dir=real)
        os.close(fd)
        os.unlink(probe)
    except UnsafeCacheError as exc:
        return Check(name, FAIL, str(exc), _unsafe_fix(path, elsewhere))
    except CacheError as exc:
        return Check(name, FAIL, str(exc), elsewhere)
    except OSError as exc:
        return Check(name, FAIL, f"cannot write in {path}: {exc.strerror or exc}", elsewhere)
    shown = root if real == root else f"{root} -> {real}"
    return Check(name, OK, f"{shown} (writable, private; {len(kernel_dirs)} kernel dir"
                           f"{'s' if len(kernel_dirs) != 1 else ''})")


def check_prebuilt(pb: prebuilt_mod.Prebuilt, platform: Platform, package: str = prebuilt_mod.PACKAGE) -> list[Check]:
    """Each prebuilt kernel of ``package`` (opforge's own, or another package's ``<pkg>._C``): present
    and intact (fail), and usable under this torch (warn)."""
    from ..engine.key import sha256_file

    ours = package == prebuilt_mod.PACKAGE
    where = "" if ours else f" of {package}"
    if not pb.names:
        return [Check(f"prebuilt kernels{where}", OK, f"none in {pb.directory} (kernels are built just in time)")]
    out = []
    for name in pb.names:
        entry = pb.entry(name) or {}
        label = f"prebuilt {name}{where}"
        kind = entry.get("kind") or name
        top = package.split(".")[0]
        reinstall = (f"reinstall with OPFORGE_BUILD={kind} "
                     f"(from opforge's source: `OPFORGE_BUILD={kind} pip install --no-build-isolation .`)" if ours else
                     f"reinstall {top} with its kernels prebuilt (its build variable, see {top}'s docs)")
        path = pb.path(name)
        try:
            digest = sha256_file(path)
        except OSError as exc:
            out.append(Check(label, FAIL, f"{path} is missing or unreadable: {exc.strerror or exc}", reinstall))
            continue
        if entry.get("sha256") and digest != entry["sha256"]:
            out.append(Check(label, FAIL, f"{path} is corrupt: its sha256 does not match build_info.json",
                             reinstall))
            continue
        verdict = pb.check(name, platform)
        if not verdict:
            torch_moved = "torch" in verdict.reason
            detail = ("torch upgraded since the prebuilt kernels were built: " if torch_moved else "") + verdict.reason
            out.append(Check(label, WARN, detail, f"{reinstall}; until then it is built just in time"))
            continue
        out.append(Check(label, OK, verdict.reason or "usable"))
    return out


_TRIAL = """
import sys, torch
torch.ops.load_library(sys.argv[1])
ops = getattr(torch.ops, sys.argv[2])
x = torch.randn(1037)
y = torch.randn(1037)
got = ops.axpy(x, y, 1.5)
want = torch.add(y, x, alpha=1.5)
if not torch.allclose(got, want, rtol=1e-6, atol=1e-6):
    print("axpy differs from torch: max abs error %g" % (got - want).abs().max().item())
    sys.exit(3)
sys.stdout.flush()
try:  # a kernel's failed input check must reach Python as an exception (a private C++ runtime crashes here)
    ops.axpy(x.double(), y, 1.0)
    print("a float64 input was accepted")
    sys.exit(4)
except RuntimeError:
    pass
print(int(ops.simd_width()))
"""


def trial_candidate(platform: Platform, prebuilt: prebuilt_mod.Prebuilt | None = None):
    """The selftest kind's best C++ variant that is accepted here, or (None, why not)."""
    from ..kernel_loader import SelftestLoader

    cands = SelftestLoader().candidates(platform, prebuilt if prebuilt is not None else prebuilt_mod.read())
    compiled = [c for c in cands if c.extension.needs_compiler]
    for c in compiled:
        if c.decision:
            return c, ""
    why = "; ".join(f"{c.name}: {c.decision.reason}" for c in compiled if c.available) or "no C++ variant fits"
    return None, why


def check_trial_build(platform: Platform, settings: settings_mod.Settings,
                      prebuilt: prebuilt_mod.Prebuilt | None = None, timeout: float = 300) -> Check:
    """Build the selftest kernel's best C++ variant (``build_jit``), load it in a child
    process and check ``axpy`` against torch. The build goes into ``settings``' cache."""
    name = "trial build"
    if platform.cxx is None or platform.ninja is None:
        missing = "no C++ compiler" if platform.cxx is None else "no ninja"
        return Check(name, WARN, f"skipped: {missing} (see above)", "fix the check above, then run `opforge doctor`")
    cand, why = trial_candidate(platform, prebuilt)
    if cand is None:
        return Check(name, WARN, f"skipped: {why}", "")
    ext = cand.extension
    was_cached = cand.status is not None and cand.status.state == CACHED
    started = time.monotonic()
    try:
        entry = ext.build_jit(settings=settings)
    except BuildError as exc:
        excerpt = (exc.excerpt or str(exc)).strip().splitlines()
        detail = f"{ext.name} does not build:\n" + "\n".join(excerpt[:12])
        return Check(name, FAIL, detail, f"see the full log: {exc.log_path}" if exc.log_path else
                     "check the compiler (CXX) and the error above")
    except OpforgeError as exc:  # a missing tool, an unusable cache, a lock held too long
        return Check(name, FAIL, f"{ext.name} could not be built: {exc}", "fix the cause named here, then rerun")
    took = time.monotonic() - started
    binary = entry.binary
    how = "found in the JIT cache" if was_cached else f"built in {took:.1f} s"
    try:
        out = subprocess.run([sys.executable, "-c", _TRIAL, binary, ext.namespace], capture_output=True,
                             text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return Check(name, FAIL, f"{ext.name} ({how}) hung while loading in a child process ({timeout:.0f} s)",
                     f"remove it (`opforge cache clean {ext.name}`) and rerun")
    if out.returncode < 0:
        return Check(name, FAIL, f"{ext.name} ({how}) crashed (signal {-out.returncode}) when its input check "
                                 "raised an error: the kernel and torch don't share one C++ runtime",
                     "use a compiler with a shared libstdc++ (e.g. CXX=/usr/bin/g++), then "
                     f"`opforge cache clean {ext.name}` and rerun")
    if out.returncode != 0:
        lines = (out.stdout + out.stderr).strip().splitlines()
        return Check(name, FAIL, f"{ext.name} ({how}) failed to load or run (exit {out.returncode}): "
                                 + "\n".join(lines[-6:]),
                     f"remove it (`opforge cache clean {ext.name}`) and rerun; if it fails again, report it")
    width = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else "?"
    return Check(name, OK, f"{ext.name} {how}, loads, and axpy matches torch (simd width {width})")


def run_checks(platform: Platform, settings: settings_mod.Settings, prebuilt: prebuilt_mod.Prebuilt,
               build: bool = True) -> list[Check]:
    checks = [check_cxx(platform, settings), check_ninja(platform), *check_cuda(platform, settings)]
    cache_check = check_cache(settings)
    checks.append(cache_check)
    checks += check_prebuilt(prebuilt, platform)
    checks += remote_cmd.check_remote(settings)
    checks.append(doctor_patch.check(settings))
    for package in other_packages():  # the kernels other packages prebuilt (their opforge.kernels entry points)
        checks += check_prebuilt(prebuilt_mod.for_package(package), platform, package)
    if build:
        if cache_check.status == FAIL:
            checks.append(Check("trial build", WARN, "skipped: the cache directory is unusable (see above)",
                                "fix the cache directory, then rerun"))
        else:
            checks.append(check_trial_build(platform, settings, prebuilt))
    return checks


def other_packages() -> list[str]:
    """The packages other than opforge that the registered extensions are prebuilt into."""
    from .. import registry

    found = {e.aot_package for cls in registry.loaders().values() for e in cls.extensions()}
    return sorted(found - {prebuilt_mod.PACKAGE})


def report(checks: list[Check]) -> dict:
    return {"schema": SCHEMA, "opforge": __version__, "ok": all(c.status != FAIL for c in checks),
            "checks": [c.to_json() for c in checks]}


# -- printing ---------------------------------------------------------------------------------


def print_plain(checks: list[Check], out=None) -> None:
    out = out or sys.stdout
    width = max(len(c.name) for c in checks)
    for c in checks:
        lines = c.detail.splitlines() or [""]
        print(f"{c.status.upper():4}  {c.name.ljust(width)}  {lines[0]}", file=out)
        for more in lines[1:]:
            print(f"{'':4}  {'':{width}}    {more}", file=out)
        if c.fix:
            print(f"{'':4}  {'':{width}}  fix: {c.fix}", file=out)


def print_rich(checks: list[Check], console=None) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = console or Console()
    colour = {OK: "green", WARN: "yellow", FAIL: "bold red"}
    table = Table(title="opforge doctor", title_justify="left")
    table.add_column("status", no_wrap=True)
    table.add_column("check", no_wrap=True)
    table.add_column("detail", overflow="fold")
    table.add_column("fix", overflow="fold")
    for c in checks:
        table.add_row(f"[{colour[c.status]}]{c.status}[/]", escape(c.name), escape(c.detail), escape(c.fix))
    console.print(table)


def cmd_doctor(args) -> int:
    from ..platform import current

    s = settings_mod.current()
    checks = run_checks(current(s), s, prebuilt_mod.read(), build=not args.no_build)
    data = report(checks)
    if args.json:
        json.dump(data, sys.stdout, indent=1)
        print()
    else:
        (print_rich if sys.stdout.isatty() else print_plain)(checks)
        n_fail = sum(c.status == FAIL for c in checks)
        n_warn = sum(c.status == WARN for c in checks)
        print("all checks passed" if not (n_fail or n_warn) else
              f"{n_fail} failed, {n_warn} warning{'s' if n_warn != 1 else ''}"
              + (": builds are blocked until the failures are fixed" if n_fail else ""))
    return 0 if data["ok"] else 1
