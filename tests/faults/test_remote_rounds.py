"""The remote cache's faults in randomised rounds (issue 34), as the kill -9 rounds do for local
builds: each round picks a fault of a remote store and the moment it strikes at random, then node B
loads the kernel, with or without a compiler, and what it got is checked.

Cheap rounds: node A builds the tiny kernel (and the odd objects some faults serve) once per module
and pushes it, signed, to WsgiDAV on localhost behind ``Misbehave`` (tests/remote_store.py). Each
round restores the store, arms one fault, and loads in this process into a fresh cache dir, with
the process's memory of dead stores (``remote_fs._DEAD``) cleared: what a new process on node B does,
less the interpreter's start-up. webdav4 retries a 500, a 503 or a dropped connection after
1 s, then 2 s; here after 0.02 s (its ``BACKOFF``), so a passing fault costs a round
milliseconds, not seconds: the retry itself is the same.

The faults (``KINDS``): a store answering 500, a connection dropped partway through an answer (a
listing or a download), a silent store (past ``OPFORGE_REMOTE_TIMEOUT``), a slow one (within it),
one that trickles an answer past it, the object deleted between the listing and the download, the
whole store gone, a truncated, corrupt or garbage object, an unsigned one, one signed by an
untrusted key, an altered signature, a re-signed manifest whose sha256 is wrong, another kernel's
object and another build of this kernel under this entry's name; and a push that fails partway
(500, a drop, silence), after which B loads. A request fault strikes the k-th request of B's load
(k at random), once (a passing fault) or from then on (a lasting one); a cut drops a random
fraction of the answer. Each strike is counted by the middleware (``Misbehave.injected``).

Every round must end in one of: B loaded A's very binary (its bytes, and a manifest that says what
A's does), B built it locally (with a compiler: a whole entry computing the right value), or (no
compiler) a clean ``ToolchainError`` naming the fix. Anything else is a bad load; a load that takes
over ``HANG_S`` is a hang. Both must be 0. And: a round whose fault never struck must pull; a
tampered signature is refused, and said to be; at most one "is not usable" notice a load; ``opforge
cache verify`` finds only whole entries in B's cache, one if B loaded, none if not; a push never
leaves a partial object under an object's name; no staging dir is left (but see
``STAGING_LEAK_KNOWN``).

``OPFORGE_TEST_REMOTE_ROUNDS`` (default 60; ``-m slow``: 1000) and ``OPFORGE_TEST_REMOTE_SEED``
set the rounds (a failure names its round and seed); ``OPFORGE_FAULT_REPORT`` writes the counts
for docs/reliability.md.
"""

from __future__ import annotations

import collections
import hashlib
import io
import json
import os
import random
import shutil
import tarfile
import threading
import time
from dataclasses import dataclass, field

import pytest

pytest.importorskip("fsspec")
pytest.importorskip("cryptography")
pytest.importorskip("wsgidav")
webdav4_retry = pytest.importorskip("webdav4.retry")

from conftest import pymod_source  # noqa: E402
from remote_store import member, objects, serve_webdav, tampered  # noqa: E402

import opforge  # noqa: E402
from opforge import settings as settings_mod  # noqa: E402
from opforge.engine import cache, inventory, remote_fs, remote_push, signing  # noqa: E402
from opforge.engine.progress import Reporter  # noqa: E402
from opforge.errors import ToolchainError  # noqa: E402

ROUNDS = int(os.environ.get("OPFORGE_TEST_REMOTE_ROUNDS", "60"))
"""CI's rounds (about 35 s on 2 cores); ``-m slow`` runs 1000."""
SEED = int(os.environ.get("OPFORGE_TEST_REMOTE_SEED", "3434"))
TIMEOUT = 1.0
"""OPFORGE_REMOTE_TIMEOUT in the rounds: what a silent store costs; a round's requests take milliseconds."""
HANG_S = 60.0
WITH_COMPILER = 0.25
"""The share of rounds in which node B has a compiler (the others have none)."""
NAME = "remote_mod"


@dataclass
class World:
    """What the module set up once: the store, its one object, and A's entry."""

    root: object
    url: str
    app: object
    src: str
    keys: dict
    entry: cache.Entry
    obj: object
    pristine: bytes
    binary: bytes
    manifest: bytes
    variants: dict = field(default_factory=dict)
    pull_requests: int = 0
    push_requests: int = 0

    def restore(self) -> None:
        """The store as A's push left it: the one object, nothing else."""
        shutil.rmtree(self.root / "opforge", ignore_errors=True)
        self.obj.parent.mkdir(parents=True)
        self.obj.write_bytes(self.pristine)

    def settle(self) -> None:
        """Disarm, free held requests, and wait for the remote worker threads that outlived their
        timeout, so that none of them meets the next round's fault."""
        self.app.release()
        deadline = time.monotonic() + 30
        for t in threading.enumerate():
            if t.name == "opforge-remote":
                t.join(max(0.0, deadline - time.monotonic()))
        stuck = [t for t in threading.enumerate() if t.name == "opforge-remote" and t.is_alive()]
        assert not stuck, f"{len(stuck)} remote worker threads still running 30 s after the store let them go"


def _build(base, name: str, value: int, secret: str, url: str, where: str) -> cache.Entry:
    """Node A: build ``name`` (returning ``value``) from ``base/where`` in A's cache and push it, signed."""
    src = base / where / f"{name}.cpp"
    src.parent.mkdir(parents=True, exist_ok=True)
    src.write_text(pymod_source(name, value))
    with pytest.MonkeyPatch.context() as mp:
        for k, v in {"OPFORGE_CACHE_DIR": str(base / "node-a"), "OPFORGE_REMOTE_CACHE": url,
                     "OPFORGE_REMOTE_PUSH": "1", "OPFORGE_SIGNING_KEY": secret, "OPFORGE_CCACHE": "0"}.items():
            mp.setenv(k, v)
        remote_fs._DEAD.clear()
        mod = opforge.load(name, [str(src)])
        assert mod.value() == value
    path = os.path.dirname(mod.__file__)
    return cache.Entry(path, cache.read_manifest(path))


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    base = tmp_path_factory.mktemp("remote-rounds")
    secret, public = signing.keygen("node-a", str(base / "keys"))
    other_secret, _ = signing.keygen("intruder", str(base / "keys"))
    keys = {"secret": secret, "public": public, "other_secret": other_secret}
    with serve_webdav(base / "dav") as (root, url, app), pytest.MonkeyPatch.context() as mp:
        mp.setattr(webdav4_retry, "BACKOFF", 0.02)
        other = _build(base, "other_mod", 5, secret, url, "src-other")
        rebuilt = _build(base, NAME, 8, secret, url, "src-8")
        entry = _build(base, NAME, 7, secret, url, "src")
        found = {o.name: o for o in objects(root)}
        obj = found[os.path.basename(entry.path) + ".tar"]
        assert obj.parent.name == entry.manifest.portable_key
        w = World(root, url, app, str(base / "src" / f"{NAME}.cpp"), keys, entry, obj, obj.read_bytes(),
                  open(entry.binary, "rb").read(), open(os.path.join(entry.path, "manifest.json"), "rb").read())
        w.variants = {**tampered(w.pristine, keys),
                      "another kernel's object": found[os.path.basename(other.path) + ".tar"].read_bytes(),
                      "another build of this kernel": found[os.path.basename(rebuilt.path) + ".tar"].read_bytes()}
        w.restore()
        app.log.clear()
        assert _load_b(w, base / "probe", compiler=False)[0] == "pulled"
        w.pull_requests = len(app.log)
        w.settle()
        shutil.rmtree(root / "opforge")
        app.log.clear()
        assert _push(w)
        w.push_requests = len(app.log)
        assert w.pull_requests >= 2 and w.push_requests >= 3, (app.log,)
        yield w


def _push(w: World):
    env = {"OPFORGE_CACHE_DIR": os.path.dirname(os.path.dirname(w.entry.path)), "OPFORGE_REMOTE_CACHE": w.url,
           "OPFORGE_REMOTE_PUSH": "1", "OPFORGE_SIGNING_KEY": w.keys["secret"],
           "OPFORGE_REMOTE_TIMEOUT": str(TIMEOUT)}
    remote_fs._DEAD.clear()
    return remote_push.push(w.entry, settings_mod.current(env), Reporter(False))


def _load_b(w: World, cache_dir, compiler: bool) -> tuple[str, str]:
    """Load the kernel as node B (a fresh cache) in a worker thread; (outcome, what it said). Outcomes:
    pulled (A's binary, and a manifest that says what A's does, built_at too), built (locally, whole, the right value), clean error (no compiler:
    a ToolchainError naming the fix), hang, or bad: ..."""
    env = {"OPFORGE_CACHE_DIR": str(cache_dir), "OPFORGE_REMOTE_CACHE": w.url, "OPFORGE_REMOTE_PUSH": "0",
           "OPFORGE_REMOTE_TIMEOUT": str(TIMEOUT), "OPFORGE_TRUSTED_KEYS": w.keys["public"], "OPFORGE_CCACHE": "0"}
    if not compiler:
        env.update(CXX="/nonexistent/c++", PATH="/nonexistent")
    box: dict = {}
    err = io.StringIO()

    def work():
        try:
            box["mod"] = opforge.load(NAME, [w.src])
        except BaseException as exc:  # noqa: BLE001 (judged below)
            box["exc"] = exc

    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        mp.delenv("OPFORGE_SIGNING_KEY", raising=False)
        mp.setattr("sys.stderr", err)
        remote_fs._DEAD.clear()
        worker = threading.Thread(target=work, name="node-b-load", daemon=True)
        worker.start()
        worker.join(HANG_S)
    said = err.getvalue()
    if worker.is_alive():
        return "hang", said
    if "exc" in box:
        exc = box["exc"]
        if not compiler and isinstance(exc, ToolchainError) and "C++ compiler" in str(exc) and "CXX" in str(exc):
            return "clean error", said
        return f"bad: raised {type(exc).__name__}: {exc}", said
    mod = box["mod"]
    with open(mod.__file__, "rb") as f:
        binary = f.read()
    with open(os.path.join(os.path.dirname(mod.__file__), "manifest.json"), "rb") as f:
        manifest = f.read()
    if not mod.__file__.startswith(str(cache_dir) + os.sep):
        return f"bad: loaded {mod.__file__}, outside B's cache", said
    if mod.value() != 7:
        return f"bad: loaded a module computing {mod.value()}, not 7", said
    if binary == w.binary and _said(manifest) == _said(w.manifest):
        return "pulled", said
    if compiler and hashlib.sha256(binary).hexdigest() == json.loads(manifest)["binary_sha256"]:
        return "built", said
    return "bad: loaded a binary that is neither A's nor a whole local build", said


def _said(manifest: bytes) -> dict:
    """What a manifest says, less the mtimes (a published copy has its own)."""
    m = json.loads(manifest)
    m.pop("binary_mtime_ns")
    m["deps"] = [{k: v for k, v in d.items() if k != "mtime_ns"} for d in m["deps"]]
    return m


def _flip(rng):
    def change(body: bytes) -> bytes:
        data = bytearray(body)
        data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        return bytes(data)

    return change


def _request_fault(fault: str, lasting: bool = True, **how):
    """A fault that strikes the k-th request of B's load (k at random), once or from then on."""

    def arm(w: World, rng: random.Random, kind: str) -> str:
        at = rng.randint(1, w.pull_requests)
        times = rng.choice((1, 99)) if lasting else 1
        extra = {k: v(w, rng) for k, v in how.items()}
        w.app.arm(fault, at=at, times=times, label=kind, **extra)
        return f"request {at} of {w.pull_requests}, {'once' if times == 1 else 'from then on'}"

    return arm


def _object_fault(change):
    """The first download of the object gets ``change(world, rng)(body)`` instead."""

    def arm(w: World, rng: random.Random, kind: str) -> str:
        w.app.arm("swap", objects=True, label=kind, change=change(w, rng))
        return "the download"

    return arm


def _variant(name: str):
    return _object_fault(lambda w, rng: lambda body: w.variants[name])


def _whole(w: World, data: bytes) -> bool:
    """Is ``data`` A's entry, whole: its binary, its manifest, A's signature of it?"""
    try:
        binary, manifest = member(data, f"/{NAME}.so"), member(data, "/manifest.json")
        doc = json.loads(member(data, remote_fs.SIGNATURE))
    except (tarfile.TarError, ValueError, KeyError, EOFError):
        return False
    return binary == w.binary and manifest == w.manifest and bool(
        signing.verify(manifest, doc, signing.trusted([w.keys["public"]])))


def _push_fault(fault: str):
    """A's push fails at its k-th request (the object was not there before it); then B loads."""

    def arm(w: World, rng: random.Random, kind: str) -> str:
        shutil.rmtree(w.root / "opforge")
        at = rng.randint(1, w.push_requests)
        extra = {"fraction": rng.random()} if fault == "cut" else {}
        w.app.arm(fault, at=at, label=kind, **extra)
        _push(w)
        w.settle()
        for o in objects(w.root):  # a final name holds the whole object, or nothing is there
            assert _whole(w, o.read_bytes()), f"a partial object under {o.name} after a push that failed"
        return f"push request {at} of {w.push_requests}"

    return arm


KINDS = {
    "500": _request_fault("500"),
    "connection dropped partway through an answer": _request_fault("cut", fraction=lambda w, rng: rng.random()),
    "silent past the timeout": _request_fault("silent"),
    "slow, within the timeout": _request_fault("slow", lasting=False, delay=lambda w, rng: TIMEOUT * 0.3),
    "trickling past the timeout": _request_fault("slow", lasting=False, delay=lambda w, rng: TIMEOUT * 0.4,
                                                 pieces=lambda w, rng: rng.randint(3, 4)),
    "object deleted between the listing and the download": _request_fault(
        "delete", delete=lambda w, rng: lambda: w.obj.unlink(missing_ok=True)),
    "the whole store gone": _request_fault(
        "delete", delete=lambda w, rng: lambda: shutil.rmtree(w.root / "opforge", ignore_errors=True)),
    "truncated object": _object_fault(lambda w, rng: lambda body: body[:rng.randrange(len(body))]),
    "a flipped bit in the object": _object_fault(lambda w, rng: _flip(rng)),
    "garbage in place of the object": _object_fault(lambda w, rng: lambda body: rng.randbytes(len(body))),
    **{name: _variant(name) for name in ("unsigned", "signed by an untrusted key", "signature altered",
                                         "manifest sha256 wrong, re-signed", "another kernel's object",
                                         "another build of this kernel")},
    "push: 500": _push_fault("500"),
    "push: connection dropped": _push_fault("cut"),
    "push: silent": _push_fault("silent"),
}
SIGNATURE_FAULTS = {"unsigned", "signed by an untrusted key", "signature altered"}
STAGING_LEAK_KNOWN = False
"""Was a bug of ``remote._pull_object``, found by these rounds (10 in 1000): a download that outlived
its timeout went on in its worker thread, and fsspec's ``get_file`` made the staging dir again after
the load removed it, so ``<cache>/.remote-*/entry.tar`` was left behind. Fixed (the download writes
into a file opened by the load); False: a leftover fails the rounds, and
``test_a_download_past_its_timeout_leaves_no_staging_dir`` shows it alone."""


def _check(w: World, kind: str, compiler: bool, outcome: str, said: str, struck: int, cache_dir) -> list[str]:
    """What is wrong with a round's outcome (nothing: [])."""
    wrong = []
    if outcome == "hang" or outcome.startswith("bad"):
        wrong.append(outcome)
    if not struck and not kind.startswith("push") and outcome != "pulled":
        wrong.append(f"the fault never struck, yet B did not pull ({outcome})")
    if kind in SIGNATURE_FAULTS and struck and (outcome == "pulled" or "refused" not in said):
        wrong.append(f"a tampered signature was not refused ({outcome})")
    if said.count("is not usable") > 1:
        wrong.append("the store was said to be unusable more than once in one load")
    if os.path.isdir(cache_dir):
        rows = inventory.verify(str(cache_dir), remove=False)
        loaded = outcome in ("pulled", "built")
        if not all(r.status == "ok" for r in rows) or len(rows) != loaded:
            wrong.append(f"B's cache holds {[(r.key, r.status) for r in rows]} after {outcome}")
        staging = [n for n in os.listdir(cache_dir) if n.startswith(".remote-")]
        if staging and not STAGING_LEAK_KNOWN:
            wrong.append(f"staging dirs left: {staging}")
    elif outcome in ("pulled", "built"):
        wrong.append("B loaded, yet has no cache dir")
    return wrong


@pytest.mark.parametrize("rounds", [pytest.param(ROUNDS, id="rounds"),
                                    pytest.param(1000, id="1000-rounds", marks=pytest.mark.slow)])
def test_random_remote_faults_in_rounds(world, tmp_path, tally, rounds):
    started = time.monotonic()
    problems = []
    outcomes = collections.Counter()
    for i in range(rounds):
        rng = random.Random(f"{SEED}-{rounds}-{i}")
        kind = rng.choice(sorted(KINDS))
        compiler = rng.random() < WITH_COMPILER
        t = tally(f"remote round: {kind}")
        world.restore()
        before = collections.Counter(world.app.injected)
        moment = KINDS[kind](world, rng, kind)
        cache_dir = tmp_path / f"node-b-{i}"
        took = time.monotonic()
        outcome, said = _load_b(world, cache_dir, compiler)
        world.settle()
        t.count("seconds", time.monotonic() - took)
        t.count("staging dirs left", os.path.isdir(cache_dir) and any(
            n.startswith(".remote-") for n in os.listdir(cache_dir)))
        struck = t.seen(world.app.injected - before)
        t.row["loads"] += 1
        t.row["hangs"] += outcome == "hang"
        t.row["torn"] += outcome.startswith("bad")
        t.row["loads_ok"] += outcome in ("pulled", "built")
        t.count("rounds struck", bool(struck))
        t.count(outcome if not outcome.startswith("bad") else "bad")
        t.count("with a compiler" if compiler else "without a compiler")
        outcomes[outcome.split(":")[0]] += 1
        wrong = _check(world, kind, compiler, outcome, said, struck, cache_dir)
        if wrong:
            problems.append(f"round {i} (OPFORGE_TEST_REMOTE_SEED={SEED}): {kind} at {moment}, "
                            f"{'a' if compiler else 'no'} compiler, struck {struck}x: {'; '.join(wrong)}\n{said}")
        assert outcome != "hang", problems[-1]
        shutil.rmtree(cache_dir, ignore_errors=True)
    took = time.monotonic() - started
    print(f"{rounds} rounds in {took:.1f} s: {dict(outcomes)}")
    assert not problems, f"{len(problems)} of {rounds} rounds went wrong:\n" + "\n".join(problems[:10])
    assert outcomes["pulled"] and outcomes["built"] and outcomes["clean error"], outcomes  # each outcome came


@pytest.mark.xfail(STAGING_LEAK_KNOWN, strict=True, reason="a known bug of remote._pull_object (STAGING_LEAK_KNOWN)")
def test_a_download_past_its_timeout_leaves_no_staging_dir(world, tmp_path):
    world.restore()
    # the download's first request (fsspec's get_file asks isdir() first), answered in 4 pieces 0.4 s
    # apart: each read within the client's own timeout, the whole answer past OPFORGE_REMOTE_TIMEOUT
    world.app.arm("slow", at=2, delay=TIMEOUT * 0.4, pieces=4, label="trickle at the download")
    outcome, said = _load_b(world, tmp_path / "node-b", compiler=False)
    assert outcome == "clean error" and "downloading" in said and "no answer within" in said, (outcome, said)
    world.settle()  # the store answers at last: the abandoned download goes on, and ends
    assert [n for n in os.listdir(tmp_path / "node-b") if n.startswith(".remote-")] == []
