"""The remote cache's faults (issue 24), one of each, each followed by a load on node B in a fresh
process that must be correct, with nothing bad published in B's cache: refused entries (unsigned,
wrongly signed, truncated, another kernel's object under this one's name, a manifest whose sha256
doesn't match its binary), and stores that break (killed mid-download, answering 500, silent past
the timeout).

Node A always pushes a signed entry; the store (WsgiDAV behind ``Misbehave``) then serves it
tampered, or breaks. Faults are counted where they land, in the suite's tally
(docs/reliability.md): the tampered objects the middleware served, the answers it broke, the
connections the silent store left unanswered. Randomised rounds of these and more:
test_remote_rounds.py."""

from __future__ import annotations

import json
import time

import pytest

pytest.importorskip("fsspec")
pytest.importorskip("cryptography")

from conftest import pymod_source  # noqa: E402
from remote_store import node_a, node_env, objects, tampered  # noqa: E402

from opforge.engine import inventory  # noqa: E402


def _load_on_b(t, tmp_path, url, source, keys, expect=7, **env) -> str:
    """Node B (its own cache, a compiler) loads in a fresh process; what it said."""
    result = t.load("remote_mod", source, expect, env=node_env(tmp_path, url, compiler=True,
                                                               OPFORGE_TRUSTED_KEYS=keys["public"], **env))
    assert result is not None and not result["torn"], t.err
    rows = inventory.verify(str(tmp_path / "node-b"), remove=False)
    assert rows and all(r.status == "ok" for r in rows), rows  # only whole entries in B's cache
    return t.err


@pytest.mark.parametrize("fault", ["unsigned", "wrongly signed", "truncated object", "another kernel's object",
                                   "manifest sha256 mismatch"])
def test_a_refused_entry_is_said_never_published_and_node_b_builds_it(monkeypatch, tmp_path, source, keys, tally,
                                                                      webdav, counting_cxx, fault):
    root, url, server = webdav
    node_a(monkeypatch, tmp_path, url, source, "remote_mod", keys["secret"])
    (obj,) = objects(root)
    pristine = obj.read_bytes()
    if fault == "another kernel's object":  # a valid, signed object of another kernel, under this one's name
        other = tmp_path / "src" / "other_mod.cpp"
        other.write_text(pymod_source("other_mod", 5))
        node_a(monkeypatch, tmp_path, url, other, "other_mod", keys["secret"], value=5)
        (theirs,) = [o for o in objects(root) if "other_mod" in str(o)]
        body = theirs.read_bytes()
    else:
        body = {"truncated object": pristine[: len(pristine) // 3],
                "unsigned": tampered(pristine, keys)["unsigned"],
                "wrongly signed": tampered(pristine, keys)["signed by an untrusted key"],
                "manifest sha256 mismatch": tampered(pristine, keys)["manifest sha256 wrong, re-signed"]}[fault]
    server.arm("swap", objects=True, times=99, label=fault, change=lambda _: body)  # every download of it
    built = len(counting_cxx.compiles())
    t = tally(f"remote: {fault}")
    err = _load_on_b(t, tmp_path, url, source, keys)
    assert t.seen(server.injected) == 1  # B downloaded the object once, and got the tampered one
    assert len(counting_cxx.compiles()) == built + 1  # refused, so built locally
    why = {"unsigned": "it is unsigned: sign pushes with OPFORGE_SIGNING_KEY",
           "wrongly signed": "its signature (by 'intruder') does not verify with any trusted key (node-a)",
           "truncated object": "not a whole one-entry opforge archive",
           "another kernel's object": "it holds another entry (other_mod/",
           "manifest sha256 mismatch": "the binary's sha256 differs from its manifest's"}[fault]
    assert "refused" in err and why in err, err


@pytest.mark.parametrize("fault", ["killed mid-download", "answers 500"])
def test_a_store_that_breaks_costs_one_notice_and_node_b_builds(monkeypatch, tmp_path, source, keys, tally, webdav,
                                                                counting_cxx, fault):
    root, url, server = webdav
    node_a(monkeypatch, tmp_path, url, source, "remote_mod", keys["secret"])
    assert server.downloads == 0 and not server.injected
    server.mode = {"killed mid-download": "cut", "answers 500": "500"}[fault]
    t = tally(f"remote: {fault}")
    err = _load_on_b(t, tmp_path, url, source, keys)
    seen = t.seen(server.injected)
    notices = [line for line in err.splitlines() if "is not usable" in line]
    assert len(notices) == 1, err  # the store broke, and B said so once
    notice = notices[0]
    if fault == "killed mid-download":  # B began the download, and every download it began was cut
        assert server.downloads >= 1 and server.injected["cut"] == server.downloads == seen
        assert f"(downloading {objects(root)[0].relative_to(root)}: " in notice, notice
    else:  # the listing met the 500s (webdav4 tries 3 times) and nothing was downloaded
        assert seen >= 1 and server.downloads == 0 and "(listing: HTTPError: received 500" in notice, notice
    assert len(counting_cxx.compiles()) == 2


# Two loads in one process (two local misses), each timing its remote lookup (``remote.fetch``).
TWO_LOADS = r"""
import json, os, sys, time
import opforge
from opforge.engine import cache, remote
from opforge.engine.key import sha256_file
fetch, spent = remote.fetch, []
def timed(*args, **kwargs):
    start = time.monotonic()
    try:
        return fetch(*args, **kwargs)
    finally:
        spent.append(time.monotonic() - start)
remote.fetch = timed
loads = []
for name, src, expect in json.loads(sys.argv[1]):
    mod = opforge.load(name, [src])
    m = cache.read_manifest(os.path.dirname(mod.__file__))
    loads.append(not (m and sha256_file(mod.__file__) == m.binary_sha256 and mod.value() == expect))
print(json.dumps({"torn": loads, "spent": spent}))
"""


def test_a_silent_store_costs_its_timeout_once_per_process(tmp_path, source, keys, tally, silent_server,
                                                           counting_cxx):
    other = source.parent / "other_mod.cpp"
    other.write_text(pymod_source("other_mod", 5))
    t = tally("remote: silent past the timeout")
    env = node_env(tmp_path, silent_server, compiler=True, OPFORGE_TRUSTED_KEYS=keys["public"],
                   OPFORGE_REMOTE_TIMEOUT="1.5")
    got = t.run(TWO_LOADS, [json.dumps([["remote_mod", str(source), 7], ["other_mod", str(other), 5]])], env)
    t.row["loads"] += 2
    assert got is not None, t.err
    t.row["torn"] += sum(got["torn"])
    t.row["loads_ok"] += got["torn"].count(False)
    assert got["torn"] == [False, False]
    time.sleep(0.5)  # the server's accept loop polls every 0.2 s
    assert t.seen({"unanswered connections": silent_server.connections}) == 1  # asked once in the process
    first, second = got["spent"]
    assert 1.5 <= first < 4.5, got  # the first lookup waited out the timeout...
    assert second < 0.5, got  # ...the second didn't ask again
    assert t.err.count("is not usable") == 1 and "no answer within 1.5 s (OPFORGE_REMOTE_TIMEOUT)" in t.err, t.err
    assert len(counting_cxx.compiles()) == 2
