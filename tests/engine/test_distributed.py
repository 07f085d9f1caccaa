"""One build per node under torch.distributed, with no collective in ``load()``.

Ranks are real processes in a gloo group on localhost (``tests/dist_worker.py``), launched
by hand (to simulate two nodes with two cache dirs) or by torchrun. A logging ``CXX`` counts
the compiles and records which rank ran each.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from conftest import ROOT, pymod_source

from opforge import settings as settings_mod
from opforge.engine.ranks import Ranks, decide

WORKER = os.path.join(ROOT, "tests", "dist_worker.py")


# --------------------------------------------------------------------------- the role (pure)

@pytest.mark.parametrize("ranks,mode,shared,builds,scope", [
    (Ranks(), "auto", False, True, "off"),
    (Ranks(rank=3, local_rank=3), "auto", False, True, "off"),  # env only, no group: the lock decides
    (Ranks(rank=3, local_rank=3, group_up=True), "0", False, True, "off"),
    (Ranks(rank=4, local_rank=0, group_up=True), "auto", False, True, "node"),
    (Ranks(rank=5, local_rank=1, group_up=True), "auto", False, False, "node"),
    (Ranks(rank=5, local_rank=1), "1", False, False, "node"),
    (Ranks(rank=4, local_rank=0, group_up=True), "auto", True, False, "global"),
    (Ranks(rank=0, local_rank=0, group_up=True), "auto", True, True, "global"),
    (Ranks(rank=None, local_rank=None, group_up=False), "1", True, True, "off"),
])
def test_who_builds(ranks, mode, shared, builds, scope):
    role = decide(ranks, mode, shared)
    assert (role.builds, role.scope) == (builds, scope)
    assert role.reason


@pytest.mark.parametrize("ranks,builds", [(Ranks(rank=0, local_rank=0, group_up=True), True),
                                         (Ranks(rank=2, local_rank=0, group_up=True), False),
                                         (Ranks(rank=3, local_rank=1, group_up=True), False)])
def test_with_a_remote_cache_global_rank_0_builds_for_the_cluster(ranks, builds):
    role = decide(ranks, "auto", False, remote=True)
    assert (role.builds, role.scope, role.builder) == (builds, "remote", "global rank 0")


def test_settings_read_the_launchers_variables():
    s = settings_mod.current({"RANK": "7", "LOCAL_RANK": "3", "OPFORGE_DISTRIBUTED": "on",
                              "OPFORGE_SHARED_CACHE": "1", "OPFORGE_DIST_GRACE": "5"})
    assert (s.rank, s.local_rank, s.distributed, s.shared_cache, s.dist_grace) == (7, 3, "1", True, 5.0)
    s = settings_mod.current({"SLURM_PROCID": "9", "SLURM_LOCALID": "1", "RANK": "x"})
    assert (s.rank, s.local_rank, s.distributed) == (9, 1, "auto")
    with pytest.raises(ValueError, match="OPFORGE_DISTRIBUTED"):
        settings_mod.current({"OPFORGE_DISTRIBUTED": "maybe"})
    with pytest.raises(ValueError, match="OPFORGE_DIST_GRACE"):
        settings_mod.current({"OPFORGE_DIST_GRACE": "-1"})


# --------------------------------------------------------------------------- real ranks

@pytest.fixture
def job(tmp_path, counting_cxx, monkeypatch):
    """Run a job of ranks; returns each rank's results. ``nodes`` maps rank -> (cache dir, local rank)."""
    rank_log = tmp_path / "ranks.log"
    monkeypatch.setenv("CXX_RANK_LOG", str(rank_log))

    def run(loads: dict, nodes: dict, delay: dict | None = None, env: dict | None = None, build_once=False,
            timeout: float = 150) -> list[list[dict]]:
        out = tmp_path / f"out-{time.monotonic_ns()}"
        out.mkdir()
        cfg = {"loads": loads, "out": str(out), "delay": {str(k): v for k, v in (delay or {}).items()},
               "init_method": f"file://{out}/store", "build_once": build_once}
        cfg_path = out / "cfg.json"
        cfg_path.write_text(json.dumps(cfg))
        procs = []
        for rank, (cache, local) in nodes.items():
            e = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(local), WORLD_SIZE=str(len(nodes)),
                     OPFORGE_CACHE_DIR=str(cache), PYTHONPATH=ROOT, **(env or {}))
            procs.append(subprocess.Popen([sys.executable, WORKER, str(cfg_path)], env=e, stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, text=True))
        try:
            for p in procs:
                output, _ = p.communicate(timeout=timeout)
                assert p.returncode == 0, output
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
        return [json.loads((out / f"rank-{r}.json").read_text()) for r in nodes]

    run.compiling_ranks = lambda: sorted(int(x) for x in rank_log.read_text().split()) if rank_log.exists() else []
    return run


def _source(tmp_path, name: str, value: int = 42, broken: bool = False) -> str:
    path = tmp_path / "src" / f"{name}.cpp"
    path.parent.mkdir(exist_ok=True)
    path.write_text(pymod_source(name, value) + ("this is not C++;\n" if broken else ""))
    return str(path)


def test_four_ranks_one_node_local_rank_0_builds(tmp_path, job):
    src = _source(tmp_path, "dist_one")
    node = tmp_path / "node"
    results = job({"*": [["dist_one", src]]}, {r: (node, r) for r in range(4)})
    assert [r[0]["value"] for r in results] == [42] * 4
    assert len({r[0]["file"] for r in results}) == 1
    assert job.compiling_ranks() == [0]


def test_eight_ranks_two_nodes_one_build_per_node(tmp_path, job):
    src = _source(tmp_path, "dist_two")
    nodes = {r: (tmp_path / ("node-a" if r < 4 else "node-b"), r % 4) for r in range(8)}
    results = job({"*": [["dist_two", src]]}, nodes)
    assert [r[0].get("value") for r in results] == [42] * 8, results
    assert job.compiling_ranks() == [0, 4]  # each node's local rank 0
    for r, res in enumerate(results):
        assert res[0]["file"].startswith(str(nodes[r][0]))


def test_a_remote_cache_makes_one_compile_in_the_whole_cluster(tmp_path, job):
    """Two nodes of two ranks, each node its own cache, one store (issue 24): global rank 0 builds and
    pushes, node two's ranks pull it (rank 0 comes late, so they wait on the store first)."""
    src = _source(tmp_path, "dist_remote")
    nodes = {r: (tmp_path / ("node-a" if r < 2 else "node-b"), r % 2) for r in range(4)}
    env = {"OPFORGE_REMOTE_CACHE": f"file://{tmp_path / 'store'}", "OPFORGE_REMOTE_PUSH": "1",
           "OPFORGE_REMOTE_ALLOW_UNSIGNED": "1"}
    results = job({"*": [["dist_remote", src]]}, nodes, delay={0: 1.5}, env=env)
    assert [r[0].get("value") for r in results] == [42] * 4, results
    assert job.compiling_ranks() == [0]  # one compile in the whole cluster
    for r, res in enumerate(results):
        assert res[0]["file"].startswith(str(nodes[r][0]))  # each node loads from its own cache


def test_shared_cache_global_rank_0_builds_for_all_nodes(tmp_path, job):
    src = _source(tmp_path, "dist_shared")
    shared = tmp_path / "nfs"
    nodes = {r: (shared, r % 2) for r in range(4)}  # two "nodes" of two ranks, one cache
    results = job({"*": [["dist_shared", src]]}, nodes, delay={0: 1.0}, env={"OPFORGE_SHARED_CACHE": "1"})
    assert [r[0]["value"] for r in results] == [42] * 4
    assert job.compiling_ranks() == [0]  # not rank 2, node two's local rank 0, although rank 0 came late


def test_a_late_builder_is_waited_for(tmp_path, job):
    src = _source(tmp_path, "dist_late")
    node = tmp_path / "node"
    results = job({"*": [["dist_late", src]]}, {r: (node, r) for r in range(4)}, delay={0: 3.0})
    assert [r[0]["value"] for r in results] == [42] * 4
    assert job.compiling_ranks() == [0]


def test_ranks_loading_different_kernels_never_deadlock(tmp_path, job):
    """Rank 0 never loads kernel B: its ranks build it themselves after the grace period, once."""
    a, b = _source(tmp_path, "dist_a", 1), _source(tmp_path, "dist_b", 2)
    node = tmp_path / "node"
    loads = {"0": [["dist_a", a]], "1": [["dist_b", b]], "2": [["dist_b", b]], "3": [["dist_a", a], ["dist_b", b]]}
    start = time.monotonic()
    results = job(loads, {r: (node, r) for r in range(4)}, env={"OPFORGE_DIST_GRACE": "2"})
    assert time.monotonic() - start < 60
    assert [[x["value"] for x in r] for r in results] == [[1], [2], [2], [1, 2]]
    ranks = job.compiling_ranks()
    assert len(ranks) == 2 and ranks[0] == 0 and ranks[1] in (1, 2, 3), ranks  # one build of each


def test_a_failed_build_is_reported_on_every_rank_and_tried_once(tmp_path, job):
    src = _source(tmp_path, "dist_broken", broken=True)
    node = tmp_path / "node"
    results = job({"*": [["dist_broken", src]]}, {r: (node, r) for r in range(4)}, delay={1: 1, 2: 1, 3: 1})
    errors = [r[0].get("error", "") for r in results]
    assert all(errors), errors
    assert "not C++" in errors[0] or "error" in errors[0]
    for e in errors[1:]:
        assert "its build failed" in e, e
    assert job.compiling_ranks() == [0]
    assert all(r[0]["seconds"] < 20 for r in results)  # no one waited out the grace period (30 s)


def test_build_once_is_a_barrier_and_survives_a_failed_build(tmp_path, job):
    src = _source(tmp_path, "dist_once")
    node = tmp_path / "node"
    results = job({"*": [["dist_once", src]]}, {r: (node, r) for r in range(4)}, delay={0: 2.0}, build_once=True)
    assert [r[0]["value"] for r in results] == [42] * 4
    assert job.compiling_ranks() == [0]
    bad = _source(tmp_path, "dist_once_bad", broken=True)
    results = job({"*": [["dist_once_bad", bad]]}, {r: (node, r) for r in range(4)}, build_once=True)
    assert all("error" in r[0] for r in results)


def test_torchrun_four_ranks(tmp_path, counting_cxx, monkeypatch):
    """The launcher users run: torchrun sets RANK, LOCAL_RANK and WORLD_SIZE itself."""
    rank_log = tmp_path / "ranks.log"
    monkeypatch.setenv("CXX_RANK_LOG", str(rank_log))
    src = _source(tmp_path, "dist_torchrun")
    out = tmp_path / "out"
    out.mkdir()
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps({"loads": {"*": [["dist_torchrun", src]]}, "out": str(out)}))
    env = dict(os.environ, OPFORGE_CACHE_DIR=str(tmp_path / "node"), PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4",
                        WORKER, str(cfg)], env=env, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    values = [json.loads((out / f"rank-{i}.json").read_text())[0]["value"] for i in range(4)]
    assert values == [42] * 4
    assert rank_log.read_text().split() == ["0"]


class _Quiet:
    """A reporter that says nothing."""

    def info(self, msg):
        pass

    notice = info


def test_a_waiting_ranks_probe_is_not_taken_for_a_failed_build(tmp_path):
    """Waiting ranks probe the build lock (taking it for microseconds). A rank that found the lock
    held by such a probe used to wait on it, find nothing published and raise BuildError as if
    the build had failed: the flaky failure of the 8-rank test. Held without a holder file is a
    probe: the rank polls on and gets the entry once the builder publishes it."""
    import threading

    import filelock

    from opforge.engine import ranks

    lock_path = str(tmp_path / "x.lock")
    published = threading.Event()
    probe = filelock.FileLock(lock_path, mode=0o600, thread_local=False)
    probe.acquire()  # another waiter's probe, caught in the act

    def builder():
        time.sleep(0.3)
        probe.release()
        time.sleep(0.3)
        published.set()

    t = threading.Thread(target=builder)
    t.start()
    s = settings_mod.current({"OPFORGE_DIST_GRACE": "20"})
    role = ranks.Role(False, "node", "local rank 0", "test")
    got = ranks.await_builder(lambda: "entry" if published.is_set() else None, lock_path, str(tmp_path / "failed"),
                              "x", role, s, _Quiet())
    t.join()
    assert got == "entry"
    assert not os.path.exists(lock_path + ".holder")  # a waiter writes none


def test_a_waiter_still_reports_a_builder_that_died_without_publishing(tmp_path):
    from opforge.engine import ranks
    from opforge.engine.lock import BuildLock
    from opforge.errors import BuildError

    lock_path = str(tmp_path / "x.lock")
    import threading

    held = threading.Event()

    def builder():
        with BuildLock(lock_path, "x", 10, lambda m: None):  # a real holder (writes its file), then gives up
            held.set()
            time.sleep(0.3)

    t = threading.Thread(target=builder)
    t.start()
    held.wait()
    s = settings_mod.current({"OPFORGE_DIST_GRACE": "20"})
    with pytest.raises(BuildError, match="released the build lock without publishing"):
        ranks.await_builder(lambda: None, lock_path, str(tmp_path / "failed"), "x",
                            ranks.Role(False, "node", "local rank 0", "test"), s, _Quiet())
    t.join()
