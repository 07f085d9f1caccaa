"""The remote cache's faults (issue 24), each followed by a load on node B in a fresh process that
must be correct, with nothing bad published in B's cache: refused entries (unsigned, wrongly
signed, truncated, another kernel's object under this one's name, a manifest whose sha256 doesn't
match its binary), and stores that break (killed mid-download, answering 500, silent past the
timeout). Counted in the suite's tally (docs/reliability.md)."""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest

pytest.importorskip("fsspec")
pytest.importorskip("cryptography")

from conftest import pymod_source  # noqa: E402
from remote_store import node_a, node_env, objects, rewrite  # noqa: E402

from opforge.engine import inventory, signing  # noqa: E402


def _load_on_b(tally, fault: str, tmp_path, url, source, keys, expect=7, **env):
    t = tally(f"remote: {fault}")
    t.fault()
    result = t.load("remote_mod", source, expect, env=node_env(tmp_path, url, compiler=True,
                                                               OPFORGE_TRUSTED_KEYS=keys["public"], **env))
    assert result is not None and not result["torn"], t.err
    rows = inventory.verify(str(tmp_path / "node-b"), remove=False)
    assert rows and all(r.status == "ok" for r in rows), rows  # only whole entries in B's cache
    return t.err


def _resign(obj, secret, change_manifest):
    """Rewrite the object's manifest with ``change_manifest`` and sign it again with ``secret`` (a signer
    that signed a bad manifest), keeping the index's sha256 of the manifest in step."""
    state = {}

    def change(name, data):
        if name.endswith("/manifest.json"):
            data = json.dumps(change_manifest(json.loads(data))).encode()
            state["manifest"] = data
        return data

    rewrite(obj, change)

    def fix(name, data):
        if name == "opforge-cache.json":
            index = json.loads(data)
            files = index["entries"][0]["files"]
            files["manifest.json"] = {"size": len(state["manifest"]),
                                      "sha256": hashlib.sha256(state["manifest"]).hexdigest()}
            return json.dumps(index).encode()
        if name == "signature.json":
            return json.dumps(signing.sign(state["manifest"], secret)).encode()
        return data

    rewrite(obj, fix)


@pytest.mark.parametrize("fault", ["unsigned", "wrongly signed", "truncated object", "another kernel's object",
                                   "manifest sha256 mismatch"])
def test_a_refused_entry_is_said_never_published_and_node_b_builds_it(monkeypatch, tmp_path, source, keys, tally,
                                                                      counting_cxx, fault):
    store = tmp_path / "store"
    url = f"file://{store}"
    signer = {"unsigned": None, "wrongly signed": keys["other_secret"]}.get(fault, keys["secret"])
    node_a(monkeypatch, tmp_path, url, source, "remote_mod", signer)
    (obj,) = objects(store)
    if fault == "truncated object":
        obj.write_bytes(obj.read_bytes()[: obj.stat().st_size // 3])
    elif fault == "another kernel's object":  # a valid, signed object of another kernel, under this one's name
        other = tmp_path / "src" / "other_mod.cpp"
        other.write_text(pymod_source("other_mod", 5))
        node_a(monkeypatch, tmp_path, url, other, "other_mod", keys["secret"], value=5)
        (theirs,) = [o for o in objects(store) if "other_mod" in str(o)]
        shutil.copyfile(theirs, obj)
    elif fault == "manifest sha256 mismatch":
        _resign(obj, keys["secret"], lambda m: dict(m, binary_sha256="0" * 64))
    built = len(counting_cxx.compiles())
    err = _load_on_b(tally, fault, tmp_path, url, source, keys)
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
    server.mode = {"killed mid-download": "cut", "answers 500": "500"}[fault]
    err = _load_on_b(tally, fault, tmp_path, url, source, keys)
    assert err.count("is not usable") == 1, err
    assert len(counting_cxx.compiles()) == 2


def test_a_silent_store_costs_its_timeout_once(monkeypatch, tmp_path, source, keys, tally, silent_server,
                                               counting_cxx):
    err = _load_on_b(tally, "silent past the timeout", tmp_path, silent_server, source, keys,
                     OPFORGE_REMOTE_TIMEOUT="1.5")
    assert "no answer within 1.5 s (OPFORGE_REMOTE_TIMEOUT)" in err and err.count("is not usable") == 1
    assert len(counting_cxx.compiles()) == 1
