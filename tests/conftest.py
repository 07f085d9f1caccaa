"""Shared fixtures.

Most engine tests build tiny modules written against the plain CPython API (no torch
headers): they compile in well under a second, so a test can afford fresh builds.
Tests that need torch's headers share one session-wide cache.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import textwrap

import pytest
from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = os.path.join(ROOT, "tests")
"""tests/: the shared helpers (``toy_reference``, ``dist_worker.py``) sit here, on sys.path under pytest."""


# The fuzz tests (``@given``) take their example counts from a profile, not from their
# decorators: "ci" (the default, what `make test` runs) keeps the suite quick; "fuzz"
# (``HYPOTHESIS_PROFILE=fuzz``) runs 1000 a test (``FUZZ_EXAMPLES`` to change it), for a fuzzing
# session (docs/reliability.md has its figures). A failure prints the blob that replays it.
hypothesis_settings.register_profile(
    "ci", max_examples=40, deadline=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large])
hypothesis_settings.register_profile("fuzz", parent=hypothesis_settings.get_profile("ci"),
                                     max_examples=int(os.environ.get("FUZZ_EXAMPLES", "1000")))
hypothesis_settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# Triton kernels run their first fitting config, untimed: tuning each of the GPU tests' many
# shapes (every candidate compiled and timed) would take most of the GPU suite's time, and
# results don't depend on the config. The tests of tuning itself set "auto" (test_tuning.py,
# test_block_sparse_calls_cuda.py).
os.environ.setdefault("OPFORGE_TRITON_TUNING", "off")

# The precompiled torch/extension.h (on by default) costs a plain compile's time once per compiler
# and flag set; the suite builds with dozens of flag sets, each once or twice, so it would only
# add time. Off here, on in the tests of it (tests/engine/test_pch.py, test_load.py's PCH tests).
os.environ.setdefault("OPFORGE_PCH", "0")


def pymod_source(name: str, value: int = 1, extra: str = "", multi_phase: bool = False) -> str:
    """C++ source of a Python module ``name`` whose ``value()`` returns ``value``. ``multi_phase``:
    initialised as pybind11 >= 3 modules are (PEP 489), which CPython does not put in ``sys.modules``
    when they are loaded from a spec (single-phase modules put themselves there)."""
    if multi_phase:
        return textwrap.dedent(
            f"""
            #include <Python.h>
            {extra}
            static PyObject* value(PyObject*, PyObject*) {{ return PyLong_FromLong({value}); }}
            static PyMethodDef methods[] = {{{{"value", value, METH_NOARGS, "the value"}}, {{nullptr, nullptr, 0, nullptr}}}};
            static PyModuleDef_Slot slots[] = {{{{0, nullptr}}}};
            static PyModuleDef mod = {{PyModuleDef_HEAD_INIT, "{name}", nullptr, 0, methods, slots}};
            PyMODINIT_FUNC PyInit_{name}() {{ return PyModuleDef_Init(&mod); }}
            """
        )
    return textwrap.dedent(
        f"""
        #include <Python.h>
        {extra}
        static PyObject* value(PyObject*, PyObject*) {{ return PyLong_FromLong({value}); }}
        static PyMethodDef methods[] = {{{{"value", value, METH_NOARGS, "the value"}}, {{nullptr, nullptr, 0, nullptr}}}};
        static PyModuleDef mod = {{PyModuleDef_HEAD_INIT, "{name}", nullptr, -1, methods}};
        PyMODINIT_FUNC PyInit_{name}() {{ return PyModule_Create(&mod); }}
        """
    )


# A stand-in libnvidia-ml with two GPUs, so the ctypes calls run without a driver.
# FAKE_NVML_FAIL names a call that returns an error; FAKE_NVML_MIXED makes GPU 1 an A100.
FAKE_NVML = textwrap.dedent(
    r"""
    #include <stdlib.h>
    #include <string.h>
    typedef struct { unsigned long long total, free, used; } mem_t;
    static int inited = 0;
    static int fail(const char* fn) { const char* f = getenv("FAKE_NVML_FAIL"); return f && !strcmp(f, fn) ? 999 : 0; }
    static int mixed(void) { return getenv("FAKE_NVML_MIXED") != NULL; }
    int nvmlInit_v2(void) { if (fail("init")) return 9; inited = 1; return 0; }
    int nvmlShutdown(void) { if (!inited) return 1; inited = 0; return 0; }
    int nvmlDeviceGetCount_v2(unsigned* n) { if (!inited) return 1; *n = 2; return fail("count"); }
    int nvmlDeviceGetHandleByIndex_v2(unsigned i, void** h) {
        if (!inited || i >= 2) return 2; *h = (void*)(size_t)(0x1000 + i); return fail("handle"); }
    static long idx(void* h) { return (long)(size_t)h - 0x1000; }
    int nvmlDeviceGetName(void* h, char* buf, unsigned len) {
        const char* n = (mixed() && idx(h) == 1) ? "NVIDIA A100-SXM4-40GB" : "NVIDIA H100 80GB HBM3";
        if (len < strlen(n) + 1) return 7; strcpy(buf, n); return fail("name"); }
    int nvmlDeviceGetUUID(void* h, char* buf, unsigned len) {
        if (len < 41) return 7; strcpy(buf, idx(h) ? "GPU-bbbbbbbb-1111-2222-3333-444444444444"
                                                   : "GPU-aaaaaaaa-1111-2222-3333-444444444444");
        return fail("uuid"); }
    int nvmlDeviceGetCudaComputeCapability(void* h, int* major, int* minor) {
        *major = (mixed() && idx(h) == 1) ? 8 : 9; *minor = 0; return fail("capability"); }
    int nvmlDeviceGetMemoryInfo(void* h, mem_t* m) {
        m->total = (mixed() && idx(h) == 1) ? (40ULL << 30) : (80ULL << 30);
        m->free = m->total; m->used = 0; return fail("memory"); }
    """
)


@pytest.fixture(scope="session")
def fake_nvml(tmp_path_factory):
    """The path of a stand-in libnvidia-ml.so (FAKE_NVML), compiled once for the session."""
    cc = shutil.which(os.environ.get("CC", "cc"))
    if cc is None:
        pytest.skip("needs a C compiler")
    d = tmp_path_factory.mktemp("fake_nvml")
    (d / "fake.c").write_text(FAKE_NVML)
    lib = d / "libfake-nvml.so"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(lib), str(d / "fake.c")], check=True)
    return str(lib)


@pytest.fixture(autouse=True)
def _no_ccache(monkeypatch):
    """Tests count compiler runs; ccache (when installed) would add preprocessor runs."""
    monkeypatch.setenv("OPFORGE_CCACHE", "0")


FAKE_CXX = textwrap.dedent("""\
    import os, shutil, sys
    args = sys.argv[1:]
    if os.environ.get("FAKE_CXX_LOG"):
        with open(os.environ["FAKE_CXX_LOG"], "a") as f:
            f.write(" ".join(args) + " | nice=%d\\n" % os.nice(0))
    out = args[args.index("-o") + 1] if "-o" in args else None
    if "c++-header" in args:  # a PCH
        if os.environ.get("FAKE_PCH_FAIL"):
            sys.exit("fatal error: no PCH for you")
        open(out, "wb").write(b"g" * int(os.environ.get("FAKE_PCH_BYTES", "1000")))
    elif out and "-c" in args:  # an object, and its depfile
        src = args[args.index("-c") + 1]
        if "-MF" in args:
            open(args[args.index("-MF") + 1], "w").write(f"{out}: {src}\\n")
        open(out, "wb").write(b"o")
    elif out and out.endswith(".so") and not any(a.endswith(".cpp") for a in args):  # the link, not a probe
        open(out, "wb").write(b"b" * int(os.environ.get("FAKE_BINARY_BYTES", "6")))
    else:  # probes: -dM -E, --version, -print-file-name, linker checks
        os.execvp(shutil.which("g++"), ["g++", *args])
""")
"""A compiler that writes its outputs without compiling (GCC answers the probes): the engine's real cold
path (ninja, the lock, publish) in milliseconds. ``FAKE_CXX_LOG``: each call's arguments and nice value;
``FAKE_PCH_FAIL``, ``FAKE_PCH_BYTES``, ``FAKE_BINARY_BYTES``: a failing PCH, the PCH's and binary's sizes."""


_TORCH_RECORD: list = []
"""The session's ``torch_record_seed`` (once made), for ``recorded_cache``."""


@pytest.fixture(scope="session")
def torch_record_seed(tmp_path_factory):
    """torch's facts and CPU build flags as the engine records them in a cache (``<cache>/.tools``,
    opforge/engine/torch_record.py), recorded once for the session by this process (which has torch imported)."""
    from opforge.engine import flags, torch_record

    seed = tmp_path_factory.mktemp("torch-record")
    facts = torch_record.torch_facts(str(seed))
    torch_record.cpu_build(str(seed), facts, lambda: flags._ask_torch("cpu", facts.version))
    assert len(list((seed / ".tools").glob("torch-*.json"))) == 2, "torch's record was not written"
    _TORCH_RECORD[:] = [seed / ".tools"]
    return seed / ".tools"


@pytest.fixture(autouse=True, scope="session")
def _torch_record_for_helpers(torch_record_seed):
    """``recorded_cache`` works from any test (the remote tests' nodes: remote_store.node_env)."""


def recorded_cache(root) -> None:
    """Make ``root`` a cache holding no build, only torch's record (as ``cache_dir``), unless it exists."""
    if os.path.exists(root):
        return
    os.makedirs(root, mode=0o700)
    os.chmod(root, 0o700)
    shutil.copytree(_TORCH_RECORD[0], os.path.join(root, ".tools"))


@pytest.fixture
def cache_dir(request, tmp_path, monkeypatch):
    """A fresh cache root for this test (OPFORGE_CACHE_DIR points at it), holding no build: only torch's
    record (``torch_record_seed``), as any cache has after its first build, so that the test's fresh
    processes don't each import torch (2.5-4 s of CPU) for the build key. A test marked ``unrecorded_cache``
    gets a root that doesn't exist yet (the engine makes it), for the cold start itself."""
    root = tmp_path / "cache"
    monkeypatch.setenv("OPFORGE_CACHE_DIR", str(root))
    if request.node.get_closest_marker("unrecorded_cache") is None:
        recorded_cache(root)
    return root


@pytest.fixture
def make_pymod(tmp_path):
    """Write a fast-compiling module source; returns its path."""

    def make(name: str, value: int = 1, extra: str = "", filename: str | None = None, multi_phase: bool = False):
        path = tmp_path / "src" / (filename or f"{name}.cpp")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(pymod_source(name, value, extra, multi_phase))
        return path

    return make


class CompilerLog:
    """A CXX wrapper that logs each call's arguments, then runs g++ (or, with $SLOW_MARKER
    set, a compile (``-c``, not a probe) first writes its command line to that file and sleeps 60 s,
    to be killed mid-compile). With $CXX_RANK_LOG
    set, each compile also logs the compiling process's $RANK there. With $CXX_SAVE_OBJECTS or
    $CXX_REUSE_OBJECTS set, a compile goes through tests/reused_objects.py: one build's objects kept, and
    another build's identical commands served from them. None of CXX_LOG, CXX_RANK_LOG, SLOW_MARKER and
    the two is a build-key input; CXX is, so a test's processes share it."""

    def __init__(self, directory):
        self.log = directory / "cxx.log"
        self.path = directory / "bin" / "cxx-wrapper"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        gxx = shlex.quote(shutil.which("g++") or "g++")
        self.path.write_text(
            "#!/bin/sh\n"
            'if [ -n "$CXX_LOG" ]; then printf \'%s\\n\' "$*" >> "$CXX_LOG"; fi\n'
            'if [ -n "$CXX_RANK_LOG" ]; then case " $* " in *" -c "*) echo "${RANK:-none}" >> "$CXX_RANK_LOG";; esac; fi\n'
            'if [ -n "$SLOW_MARKER" ]; then case " $* " in *" -c "*) printf \'%s\\n\' "$*" > "$SLOW_MARKER"; sleep 60;; esac; fi\n'
            'if [ -n "$CXX_SAVE_OBJECTS$CXX_REUSE_OBJECTS" ]; then case " $* " in *" -c "*) '
            f'exec {shlex.quote(sys.executable)} {shlex.quote(os.path.join(TESTS, "reused_objects.py"))} {gxx} "$@";; esac; fi\n'
            f'exec {gxx} "$@"\n'
        )
        self.path.chmod(0o755)

    def calls(self) -> list[list[str]]:
        try:
            return [ln.split() for ln in self.log.read_text().splitlines() if ln.strip()]
        except FileNotFoundError:
            return []

    def compiles(self) -> list[str]:
        return [" ".join(a) for a in self.calls() if "-c" in a]

    def links(self) -> list[str]:
        """The builds' links (not the probes of ``toolchain.links_with`` and ``accepts_prefix_map``)."""
        return [" ".join(a) for a in self.calls()
                if "-c" not in a and "-E" not in a and "-o" in a
                and not any(x.endswith(os.sep + "probe.cpp") for x in a)]

    def probes(self) -> list[list[str]]:
        """``CXX --version``: each cold path runs it once, for the manifest."""
        return [a for a in self.calls() if a == ["--version"]]

    def clear(self) -> None:
        self.log.write_text("")


@pytest.fixture
def counting_cxx(tmp_path, monkeypatch):
    """CXX (and CXX_LOG) pointed at a logging g++ wrapper; see CompilerLog."""
    if shutil.which("g++") is None:
        pytest.skip("needs g++ on PATH")
    cxx = CompilerLog(tmp_path)
    monkeypatch.setenv("CXX", str(cxx.path))
    monkeypatch.setenv("CXX_LOG", str(cxx.log))
    monkeypatch.delenv("SLOW_MARKER", raising=False)
    return cxx


@pytest.fixture(scope="session")
def shared_cache(tmp_path_factory):
    """One cache for the whole session, for builds that include torch's headers. Under
    pytest-xdist, one for all the workers (their base temp dirs share a parent): opforge's
    build lock makes it one build of each extension, as for any N processes."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent
    path = base / "shared-cache"
    path.mkdir(mode=0o700, exist_ok=True)
    return path


def in_cache(cache, load):
    """``load()`` with OPFORGE_CACHE_DIR pointing at ``cache`` (for module-scoped fixtures, which
    can't take the function-scoped ``monkeypatch``): what it builds goes to the shared cache."""
    mp = pytest.MonkeyPatch()
    mp.setenv("OPFORGE_CACHE_DIR", str(cache))
    try:
        return load()
    finally:
        mp.undo()


def run_python(code: str, env: dict | None = None, timeout: float = 300, **kw) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter with opforge importable."""
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = ROOT + os.pathsep + full_env.get("PYTHONPATH", "")
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-c", code], env=full_env, capture_output=True, text=True,
                          timeout=timeout, **kw)


def kill_session(sid: int) -> dict[int, str]:
    """SIGKILL every process of session ``sid`` (one we started); their pid -> command line."""
    killed = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8", errors="replace") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[3]) != sid:  # state, ppid, pgrp, session
                continue
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            os.kill(int(entry), signal.SIGKILL)
            killed[int(entry)] = cmd
        except (OSError, IndexError, ValueError):
            continue
    return killed


def has_cxx() -> bool:
    return shutil.which(os.environ.get("CXX", "c++")) is not None


def has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def triton_or_skip():
    """triton, for the kernels' tests in its interpreter; a skip without it, unless
    ``OPFORGE_TEST_REQUIRE_TRITON=1`` (``.ci/run``, whose ``make test`` installs it) makes that a
    failure."""
    if os.environ.get("OPFORGE_TEST_REQUIRE_TRITON") == "1":
        import triton

        return triton
    return pytest.importorskip("triton")


# The files that take longest on the 2-core CI machine (seconds of one xdist worker, measured), run
# first: `make test` hands the two workers whole files in collection order (--dist loadfile
# --no-loadscope-reorder), so one that starts last sets the run's tail; longest first, the
# workers finish within a minute or so of each other. Files not named here follow in collection order.
# Measured 2026-11-28 in a 1131 s run (branch ci20, with torch's record seeded into the tests' fresh caches;
# the remote files' node caches were seeded after it: ~15 % off those).
SLOW_FILES_FIRST = (
    "tests/clients/test_deepspeed.py",  # ~210 (~270 when torch's load compiled DeepSpeed's sources again)
    "tests/engine/test_load.py",  # ~205
    "tests/clients/test_ds_example.py",  # ~190
    "tests/kernels/block_sparse/test_block_sparse_interpreted.py",  # ~165
    "tests/engine/test_distributed.py",  # ~120
    "tests/kernels/bias_act/test_bias_act_triton.py",  # ~115
    "tests/loader/test_aot.py",  # ~95
    "tests/docs/test_docs_migrating.py",  # ~70
    "tests/faults/test_remote_faults.py",  # ~65
    "tests/kernels/bias_act/test_bias_act.py",  # ~60
    "tests/faults/test_fault_injection.py",  # ~60 (~160 before the tests' caches held torch's record)
    "tests/loader/test_downstream.py",  # ~55
    "tests/remote/test_remote_cache.py",  # ~50
    "tests/engine/test_patch_hook.py",  # ~45
    "tests/remote/test_remote_waits.py",  # ~40
    "tests/remote/test_remote_objects.py",  # ~40
    "tests/faults/test_cache_faults.py",  # ~40
    "tests/remote/test_relocated.py",  # ~35
    "tests/kernels/block_sparse/test_block_sparse_pairs.py",  # ~35
    "tests/cli/test_bench.py",  # ~35
    "tests/loader/test_pybind_extension.py",  # ~30
    "tests/kernels/block_sparse/test_block_sparse_autograd.py",  # ~30
    "tests/faults/test_remote_rounds.py",  # ~30
    "tests/kernels/bias_act/test_bias_act_native.py",  # ~30
    "tests/loader/test_loader.py",  # ~30
    "tests/cli/test_cli_build.py",  # ~30
)


def _slow_first(items) -> None:
    rank = {path: i for i, path in enumerate(SLOW_FILES_FIRST)}
    last = len(SLOW_FILES_FIRST)
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], last))  # stable: the rest keep their order


def pytest_collection_modifyitems(config, items):
    _slow_first(items)
    if has_cuda():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


# The remote cache's stores and nodes (tests/remote, tests/faults/test_remote_faults.py): fixtures
# that start a WebDAV server, a silent one, moto's S3 server, and make signing keys.
from remote_store import keys, s3, silent_server, source, webdav  # noqa: E402,F401
