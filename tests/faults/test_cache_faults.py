"""Faults the cache must survive: killed builds, crowds, corrupt binaries, stale inputs,
unsafe permissions, held locks.

Loads whose result must come from a fresh interpreter (a process cannot unload a module,
and a binary that is mapped into this process must not be corrupted under it) run in
subprocesses; the rest run in-process. Every module is a plain CPython-API one (compiles
in well under a second).
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import threading
import time

import pytest
from conftest import ROOT, kill_session, pymod_source, run_python

import opforge
from opforge import settings as settings_mod
from opforge.cli.main import main as cli_main
from opforge.engine import cache
from opforge.engine.cache import Entry, Layout
from opforge.engine.key import make_spec, sha256_file
from opforge.engine.lock import BuildLock, read_holder

# --------------------------------------------------------------------------- helpers


def _env(**extra: str) -> dict[str, str]:
    """Our environment (incl. monkeypatched vars) with opforge importable, plus ``extra``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


def _loader_code(name: str, sources: list, catch_timeout: bool = False, **kwargs) -> str:
    """A script that loads the extension and prints {"value", "file"} as JSON."""
    load = f"m = opforge.load({name!r}, {[str(s) for s in sources]!r}, **{kwargs!r})"
    if catch_timeout:
        load = (
            "try:\n"
            f"    {load}\n"
            "except opforge.LockTimeoutError as exc:\n"
            "    print('LockTimeoutError: ' + str(exc))\n"
            "    sys.exit(3)"
        )
    return f"import json, sys\nimport opforge\n{load}\nprint(json.dumps({{'value': m.value(), 'file': m.__file__}}))\n"


def _load_fresh(code: str, env: dict | None = None, timeout: float = 120) -> tuple[dict, str]:
    """Run a loader script in a fresh interpreter; its JSON result and its stderr."""
    res = run_python(code, env=env, timeout=timeout)
    assert res.returncode == 0, f"loader failed (exit {res.returncode}):\n{res.stderr}"
    return json.loads(res.stdout.strip().splitlines()[-1]), res.stderr


def _entries(name_dir) -> list[str]:
    try:
        return sorted(n for n in os.listdir(name_dir) if not n.startswith("."))
    except FileNotFoundError:
        return []


def _lock_of(name: str, sources: list) -> str:
    """The build-lock path a default load() of ``name`` would take, made ready to be taken."""
    s = settings_mod.current()
    spec = make_spec(s, name, [str(p) for p in sources], None, None, None, None, None, True, False)
    layout = Layout(s.cache_dir)
    os.makedirs(layout.root, mode=0o700, exist_ok=True)
    os.makedirs(layout.name_dir(name), mode=0o700, exist_ok=True)
    return layout.lock_path(spec.name, spec.config_key)


class _StderrReader:
    """Collects a subprocess's stderr lines on a thread; can wait for a line."""

    def __init__(self, proc: subprocess.Popen):
        self.lines: list[str] = []
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, args=(proc,), daemon=True)
        self._thread.start()

    def _run(self, proc):
        for line in proc.stderr:
            with self._cond:
                self.lines.append(line)
                self._cond.notify_all()

    def wait_for(self, text: str, timeout: float) -> str | None:
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for line in self.lines:
                    if text in line:
                        return line
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(left)

    def text(self) -> str:
        self._thread.join(timeout=10)
        with self._cond:
            return "".join(self.lines)


# --------------------------------------------------------------------------- kill -9


def test_kill_9_mid_build_then_fresh_load(cache_dir, make_pymod, counting_cxx, tmp_path):
    name = "killed_ext"
    src = make_pymod(name, 11)
    code = _loader_code(name, [src])
    lock_path = _lock_of(name, [src])
    marker = tmp_path / "compiler-started"
    victim_err = tmp_path / "victim.stderr"
    with open(victim_err, "w") as err:
        victim = subprocess.Popen([sys.executable, "-c", code], env=_env(SLOW_MARKER=str(marker)),
                                  stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not marker.exists():
            if victim.poll() is not None:
                pytest.fail(f"the loader exited (rc {victim.returncode}) before compiling:\n{victim_err.read_text()}")
            if time.monotonic() > deadline:
                pytest.fail("the compiler wrapper never started")
            time.sleep(0.02)
        holder = read_holder(lock_path)
        assert holder is not None and holder.pid == victim.pid  # it is mid-build, holding the lock

        os.kill(victim.pid, signal.SIGKILL)
        assert victim.wait(timeout=30) == -signal.SIGKILL
        assert os.path.exists(lock_path + ".holder")  # it had no chance to clean up
        # Its ninja and the sleeping wrapper live on, orphaned; the lock must not.

        started = time.monotonic()
        result, err_text = _load_fresh(code, timeout=120)
        took = time.monotonic() - started
        assert result["value"] == 11
        assert took < 30, f"the fresh load took {took:.1f} s: did it wait for the dead build?"
        assert "waiting for the build lock" not in err_text
        assert "interrupted" in err_text and f"pid {victim.pid}" in err_text
        assert not os.path.exists(lock_path + ".holder")
        assert len(_entries(cache_dir / name)) == 1
    finally:
        if victim.poll() is None:
            victim.kill()
            victim.wait()
        # The orphans (ninja, the wrapper shell, its sleep) are in the victim's session;
        # ninja puts each command in a process group of its own, so go by session id.
        kill_session(victim.pid)


# --------------------------------------------------------------------------- crowd


def test_eight_processes_build_once(cache_dir, counting_cxx, tmp_path):
    name = "crowd_ext"
    srcdir = tmp_path / "src"
    srcdir.mkdir()
    main_src = srcdir / "crowd_main.cpp"
    main_src.write_text(pymod_source(name, "helper_a() + helper_b()", extra="int helper_a(); int helper_b();"))
    (srcdir / "helper_a.cpp").write_text("int helper_a() { return 40; }\n")
    (srcdir / "helper_b.cpp").write_text("int helper_b() { return 2; }\n")
    sources = [main_src, srcdir / "helper_a.cpp", srcdir / "helper_b.cpp"]

    go = tmp_path / "go"
    # Each process gets torch and opforge imported, says it is ready, and waits for "go".
    code = (
        "import os, sys, time\nimport torch, opforge\n"
        "open(sys.argv[1], 'w').close()\n"
        f"while not os.path.exists({str(go)!r}):\n    time.sleep(0.005)\n"
        + _loader_code(name, sources)
    )
    n = 8
    ready = [tmp_path / f"ready-{i}" for i in range(n)]
    procs = [
        subprocess.Popen([sys.executable, "-c", code, str(r)], env=_env(), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
        for r in ready
    ]
    try:
        deadline = time.monotonic() + 90
        while not all(r.exists() for r in ready):
            dead = [p for p in procs if p.poll() is not None]
            if dead:
                pytest.fail(f"a loader died before the start: {dead[0].communicate()}")
            assert time.monotonic() < deadline, "the loaders never got ready"
            time.sleep(0.02)
        go.touch()
        results = []
        for p in procs:
            out, err = p.communicate(timeout=120)
            assert p.returncode == 0, err
            results.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()

    assert [r["value"] for r in results] == [42] * n
    assert len({r["file"] for r in results}) == 1  # all got the same entry
    compiles = counting_cxx.compiles()
    assert len(compiles) == len(sources), "\n".join(compiles)
    for s in sources:  # once per source
        assert sum(str(s) in c.split() for c in compiles) == 1, (s, compiles)
    assert len(counting_cxx.links()) == 1, counting_cxx.links()
    # One cold path in all: the others found the published entry once they got the lock
    # (each build probes `CXX --version` once for the manifest).
    assert len(counting_cxx.probes()) <= 1, counting_cxx.probes()
    assert len(_entries(cache_dir / name)) == 1


# --------------------------------------------------------------------------- corrupt binaries


def test_corrupt_binary_is_detected_and_rebuilt(cache_dir, make_pymod):
    name = "corrupt_ext"
    src = make_pymod(name, 21)
    code = _loader_code(name, [src])
    first, _ = _load_fresh(code)  # built in another process: never mapped into this one
    binary = first["file"]
    entry = os.path.dirname(binary)

    for how in ("append", "truncate"):
        size = os.path.getsize(binary)
        if how == "append":
            with open(binary, "ab") as f:
                f.write(b"\0not part of the binary" * 40)
        else:
            os.truncate(binary, size // 2)
        result, err = _load_fresh(code)
        assert result["value"] == 21, how
        assert "corrupt" in err, (how, err)
        assert result["file"] == binary  # the same entry, re-published
        m = cache.read_manifest(entry)
        assert m is not None and sha256_file(binary) == m.binary_sha256, how
        assert cache.binary_state(Entry(entry, m), full_hash=True) == "ok"
        assert _entries(cache_dir / name) == [os.path.basename(entry)]


def test_a_clean_between_publish_and_import_costs_a_rebuild_not_the_load(cache_dir, make_pymod, counting_cxx,
                                                                          monkeypatch):
    """`opforge cache clean` may remove a fresh entry after its build published it and before the
    loading process imported it (a busy machine widens that window): the load builds again."""
    from opforge.engine import jit

    name = "clean_window_ext"
    src = make_pymod(name, 17)
    real_import, removed = jit._import, []

    def clean_first(entry, spec, reporter):
        if not removed:
            removed.append(entry.path)
            cache.discard(entry.path)
        return real_import(entry, spec, reporter)

    monkeypatch.setattr(jit, "_import", clean_first)
    mod = opforge.load(name, [str(src)])
    assert mod.value() == 17 and len(removed) == 1
    assert os.path.exists(mod.__file__) and os.path.dirname(mod.__file__) == removed[0]  # published again
    assert len(counting_cxx.links()) == 1  # the build directory still held its outputs: nothing recompiled


def test_a_fresh_binary_that_is_there_but_unreadable_is_an_error_not_a_loop(cache_dir, make_pymod, counting_cxx,
                                                                            monkeypatch):
    from opforge.engine import jit

    src = make_pymod("unreadable_ext", 3)
    monkeypatch.setattr(jit, "_import", lambda entry, spec, reporter: None)
    with pytest.raises(opforge.errors.BuildError, match="could not be read back"):
        opforge.load("unreadable_ext", [str(src)])
    assert len(counting_cxx.links()) == 1


def test_cache_verify_finds_corruption_with_size_and_mtime_kept(cache_dir, make_pymod, capsys):
    name = "verify_ext"
    src = make_pymod(name, 5)
    first, _ = _load_fresh(_loader_code(name, [src]))
    binary = first["file"]
    entry = os.path.dirname(binary)
    before = os.stat(binary)

    with open(binary, "r+b") as f:  # flip bytes in place: same size
        f.seek(before.st_size // 2)
        chunk = f.read(256)
        f.seek(before.st_size // 2)
        f.write(bytes(b ^ 0xFF for b in chunk))
    os.utime(binary, ns=(before.st_atime_ns, before.st_mtime_ns))  # and the same mtime
    after = os.stat(binary)
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    m = cache.read_manifest(entry)
    assert cache.binary_state(Entry(entry, m)) == "ok"  # a stat check cannot see it
    assert sha256_file(binary) != m.binary_sha256

    assert cli_main(["cache", "verify"]) == 1
    out = capsys.readouterr().out
    assert "corrupt" in out
    assert not os.path.exists(entry)
    assert _entries(cache_dir / name) == []

    assert cli_main(["cache", "verify"]) == 0  # nothing bad left
    assert "0 corrupt" in capsys.readouterr().out


# --------------------------------------------------------------------------- invalidation


def test_changed_inputs_never_load_a_stale_binary(cache_dir, counting_cxx, tmp_path):
    name = "stale_ext"
    inc = tmp_path / "inc"
    inc.mkdir()
    header = inc / "stale_values.h"
    src = tmp_path / "src" / f"{name}.cpp"
    src.parent.mkdir()

    def write_source(n: int) -> None:
        src.write_text(pymod_source(name, f"{n} * 100 + HEADER_VALUE * 10 + VALUE", extra='#include "stale_values.h"'))

    def write_header(n: int) -> None:
        header.write_text(f"#define HEADER_VALUE {n}\n")

    def load(flag: int, env: dict | None = None) -> tuple[int, str, int]:
        """(value, binary, compiles it ran) of a load in a fresh process."""
        before = len(counting_cxx.compiles())
        code = _loader_code(name, [src], extra_cflags=[f"-DVALUE={flag}"], extra_include_paths=[str(inc)])
        result, _ = _load_fresh(code, env=env)
        return result["value"], result["file"], len(counting_cxx.compiles()) - before

    write_source(1)
    write_header(1)
    v1, f1, c1 = load(2)
    assert (v1, c1) == (112, 1)

    assert load(2) == (112, f1, 0)  # unchanged: warm, no compile

    write_source(2)  # a source
    v2, f2, c2 = load(2)
    assert (v2, c2) == (212, 1)
    assert f2 != f1

    write_header(3)  # an included header (same size, new content)
    v3, f3, c3 = load(2)
    assert (v3, c3) == (232, 1)
    assert f3 != f2

    write_header(1)  # back to the old header: the old entry again, no compile
    assert load(2) == (212, f2, 0)

    v4, f4, c4 = load(3)  # a flag
    assert (v4, c4) == (213, 1)
    assert f4 not in (f1, f2, f3)

    root2 = tmp_path / "other-cache"  # the cache root
    v5, f5, c5 = load(3, env={"OPFORGE_CACHE_DIR": str(root2)})
    assert (v5, c5) == (213, 1)
    assert f5.startswith(str(root2) + os.sep)
    assert len(_entries(root2 / name)) == 1
    assert len(_entries(cache_dir / name)) == 4


# --------------------------------------------------------------------------- unsafe cache


def _build_in_process(name: str, make_pymod, value: int = 5):
    src = make_pymod(name, value)
    mod = opforge.load(name, [str(src)])
    assert mod.value() == value
    return src, mod


@pytest.mark.parametrize("bits", [stat.S_IWGRP, stat.S_IWOTH], ids=["group-writable", "world-writable"])
def test_writable_by_others_is_refused(cache_dir, make_pymod, bits):
    name = "unsafe_mode_" + ("g" if bits == stat.S_IWGRP else "o")
    src, mod = _build_in_process(name, make_pymod)
    binary = mod.__file__
    targets = {"name dir": str(cache_dir / name), "entry dir": os.path.dirname(binary), "binary": binary}
    for what, target in targets.items():
        mode = stat.S_IMODE(os.lstat(target).st_mode)
        os.chmod(target, mode | bits)
        try:
            with pytest.raises(opforge.UnsafeCacheError) as exc:
                opforge.load(name, [str(src)])
            msg = str(exc.value)
            assert target in msg, what
            assert f"chmod go-w {target}" in msg, what
        finally:
            os.chmod(target, mode)
    assert opforge.load(name, [str(src)]).value() == 5  # safe again


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to chown to another user")
def test_owned_by_another_user_is_refused(cache_dir, make_pymod):
    name = "unsafe_owner"
    src, mod = _build_in_process(name, make_pymod)
    binary = mod.__file__
    for target in (str(cache_dir / name), os.path.dirname(binary), binary):
        st = os.lstat(target)
        os.chown(target, 65534, 65534)
        try:
            with pytest.raises(opforge.UnsafeCacheError) as exc:
                opforge.load(name, [str(src)])
            msg = str(exc.value)
            assert target in msg and "65534" in msg
            assert "OPFORGE_CACHE_DIR" in msg or f"rm -r {target}" in msg  # how to get out of it
        finally:
            os.chown(target, st.st_uid, st.st_gid)
    assert opforge.load(name, [str(src)]).value() == 5


def test_binary_replaced_by_symlink_is_refused(cache_dir, make_pymod, tmp_path):
    name = "unsafe_link"
    src, mod = _build_in_process(name, make_pymod)
    binary = mod.__file__
    real = tmp_path / "elsewhere.so"
    os.rename(binary, real)  # the same bytes, reached through a link
    os.symlink(real, binary)
    try:
        with pytest.raises(opforge.UnsafeCacheError) as exc:
            opforge.load(name, [str(src)])
        msg = str(exc.value)
        assert "symbolic link" in msg and binary in msg
        assert f"rm {binary}" in msg
    finally:
        os.unlink(binary)
        os.rename(real, binary)
    assert opforge.load(name, [str(src)]).value() == 5


@pytest.mark.unrecorded_cache  # the engine makes the root too
def test_created_dirs_are_private(cache_dir, make_pymod):
    old = os.umask(0o002)  # a permissive umask must not leak into the cache
    try:
        _, mod = _build_in_process("private_dirs", make_pymod)
    finally:
        os.umask(old)
    entry = os.path.dirname(mod.__file__)
    for d in (str(cache_dir), str(cache_dir / "private_dirs"), entry):
        assert stat.S_IMODE(os.stat(d).st_mode) == 0o700, d
    assert not os.stat(mod.__file__).st_mode & (stat.S_IWGRP | stat.S_IWOTH)


# --------------------------------------------------------------------------- lock waiting


def test_waits_for_the_build_lock_then_loads(cache_dir, make_pymod):
    name = "lock_wait_ext"
    src = make_pymod(name, 8)
    lock = BuildLock(_lock_of(name, [src]), "the test", 5, lambda msg: None)
    lock.__enter__()
    released = False
    proc = subprocess.Popen([sys.executable, "-c", _loader_code(name, [src])], env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        reader = _StderrReader(proc)
        line = reader.wait_for("waiting for the build lock", timeout=60)
        assert line is not None, f"no lock notice; rc {proc.poll()}, stderr:\n{''.join(reader.lines)}"
        assert f"pid {os.getpid()}" in line  # names the holder
        time.sleep(0.3)
        assert proc.poll() is None  # still waiting while we hold it
        assert _entries(cache_dir / name) == []
        lock.__exit__(None, None, None)
        released = True
        out = proc.stdout.read()
        assert proc.wait(timeout=60) == 0, reader.text()
        assert json.loads(out.strip().splitlines()[-1])["value"] == 8
        assert "interrupted" not in reader.text()  # a clean release is not a dead holder
    finally:
        if not released:
            lock.__exit__(None, None, None)
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_lock_timeout_names_the_holder(cache_dir, make_pymod):
    name = "lock_timeout_ext"
    src = make_pymod(name, 9)
    with BuildLock(_lock_of(name, [src]), "the test", 5, lambda msg: None):
        started = time.monotonic()
        res = run_python(_loader_code(name, [src], catch_timeout=True), env={"OPFORGE_LOCK_TIMEOUT": "1"},
                         timeout=120)
        took = time.monotonic() - started
    assert res.returncode == 3, f"expected LockTimeoutError, rc {res.returncode}\n{res.stdout}\n{res.stderr}"
    msg = res.stdout
    assert "LockTimeoutError: " in msg
    assert f"pid {os.getpid()}" in msg
    assert "OPFORGE_LOCK_TIMEOUT" in msg
    assert took < 30
    assert _entries(cache_dir / name) == []


def test_lock_timeout_in_process(cache_dir, make_pymod, monkeypatch):
    """The same timeout in this process (flock conflicts between two opens of the lock file)."""
    name = "lock_timeout_inproc"
    src = make_pymod(name, 4)
    monkeypatch.setenv("OPFORGE_LOCK_TIMEOUT", "0.5")
    with BuildLock(_lock_of(name, [src]), "the test", 5, lambda msg: None):
        with pytest.raises(opforge.LockTimeoutError, match=f"held by pid {os.getpid()}.*OPFORGE_LOCK_TIMEOUT"):
            opforge.load(name, [str(src)])
    assert _entries(cache_dir / name) == []
    assert opforge.load(name, [str(src)]).value() == 4  # released: the next load builds it


def test_a_binary_published_again_after_a_failed_import_is_imported(cache_dir, make_pymod, counting_cxx, monkeypatch):
    """A cache clean removes a fresh entry before its import, and another process's build publishes it again
    before this one looks why the import failed (seen with 4 loaders and a clean every 0.1 s on a busy
    machine): the binary is there, whole, so the load imports it rather than call it unreadable."""
    from opforge.engine import jit

    name = "republished_ext"
    src = make_pymod(name, 19)
    real_import, seen = jit._import, []

    def gone_then_back(entry, spec, reporter):
        if not seen:  # the import found it gone (the clean); by the check after, it is back (the other build)
            seen.append(entry.path)
            return None
        return real_import(entry, spec, reporter)

    monkeypatch.setattr(jit, "_import", gone_then_back)
    mod = opforge.load(name, [str(src)])
    assert mod.value() == 19 and os.path.dirname(mod.__file__) == seen[0]
    assert len(counting_cxx.links()) == 1
