"""The remote binary cache (issue 24): node A builds and pushes, node B pulls and loads with no
compiler, against stores the tests start themselves: a directory (``file://``), a real WebDAV server
(WsgiDAV on localhost, webdav4 as the client) and the S3 protocol (moto's server, s3fs). The
faults (refused entries, dead or broken stores) are in tests/faults/test_remote_faults.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from conftest import ROOT

pytest.importorskip("fsspec")
pytest.importorskip("cryptography")

from remote_store import USE, node_a, node_b, node_env, objects  # noqa: E402

from opforge.engine import remote_fs, signing  # noqa: E402


def test_node_b_with_no_compiler_loads_what_node_a_built_and_pushed(monkeypatch, tmp_path, source, keys,
                                                                    counting_cxx, silent_server):
    store = tmp_path / "store"
    url = f"file://{store}"
    node_a(monkeypatch, tmp_path, url, source, "remote_mod", keys["secret"])
    assert len(counting_cxx.compiles()) == 1
    (obj,) = objects(store)
    assert obj.parent.parent.name == "remote_mod" and obj.parent.parent.parent.name == remote_fs.PREFIX
    got, err = node_b(tmp_path, url, source, "remote_mod", OPFORGE_TRUSTED_KEYS=keys["public"])
    assert got["value"] == 7 and got["file"].startswith(str(tmp_path / "node-b"))
    # Node B has no compiler (its CXX and PATH name nothing), so its load proves the pull; that it compiles
    # nothing when it has node A's compiler is tests/remote/test_relocated.py's.
    assert len(counting_cxx.compiles()) == 1
    # Now a local hit: the store isn't asked. A store that never answers would cost its timeout and a notice.
    warm, err = node_b(tmp_path, url, source, "remote_mod", OPFORGE_TRUSTED_KEYS=keys["public"],
                       OPFORGE_REMOTE_CACHE=silent_server, OPFORGE_REMOTE_TIMEOUT="30")
    assert warm["file"] == got["file"] and "not usable" not in err
    assert silent_server.connections == 0


def test_unsigned_entries_load_when_explicitly_allowed(monkeypatch, tmp_path, source, counting_cxx):
    url = f"file://{tmp_path / 'store'}"
    monkeypatch.setenv("OPFORGE_REMOTE_ALLOW_UNSIGNED", "1")  # else node A's unsigned push is refused
    node_a(monkeypatch, tmp_path, url, source, "remote_mod")
    got, _ = node_b(tmp_path, url, source, "remote_mod", OPFORGE_REMOTE_ALLOW_UNSIGNED="1")
    assert got["value"] == 7 and len(counting_cxx.compiles()) == 1


def test_over_webdav_node_a_pushes_and_node_b_pulls(monkeypatch, tmp_path, source, keys, webdav, counting_cxx):
    root, url, server = webdav
    node_a(monkeypatch, tmp_path, url, source, "remote_mod", keys["secret"])
    (obj,) = objects(root)
    assert obj.relative_to(root).parts[:3] == ("opforge", remote_fs.PREFIX, "remote_mod")
    got, _ = node_b(tmp_path, url, source, "remote_mod", OPFORGE_TRUSTED_KEYS=keys["public"])
    assert got["value"] == 7 and len(counting_cxx.compiles()) == 1 and server.downloads == 1


def test_eight_processes_on_node_b_at_once_make_one_download_and_all_load(monkeypatch, tmp_path, source, keys,
                                                                          webdav, counting_cxx):
    root, url, server = webdav
    node_a(monkeypatch, tmp_path, url, source, "remote_mod", keys["secret"])
    code = USE.replace("NAME", "'remote_mod'").replace("SOURCE", repr(str(source)))
    env = dict(os.environ, PYTHONPATH=ROOT, **node_env(tmp_path, url, OPFORGE_TRUSTED_KEYS=keys["public"]))
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(8)]
    results = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err[-2000:] for _, err in results]
    files = {json.loads(out.strip().splitlines()[-1])["file"] for out, _ in results}
    assert len(files) == 1 and server.downloads == 1 and len(counting_cxx.compiles()) == 1


def test_over_s3_node_a_pushes_and_node_b_pulls(monkeypatch, tmp_path, source, keys, s3, counting_cxx):
    url, env = s3
    import fsspec

    monkeypatch.setitem(fsspec.config.conf, "s3", {"endpoint_url": env["FSSPEC_S3_ENDPOINT_URL"]})
    node_a(monkeypatch, tmp_path, url, source, "remote_mod", keys["secret"])
    got, _ = node_b(tmp_path, url, source, "remote_mod", OPFORGE_TRUSTED_KEYS=keys["public"], **env)
    assert got["value"] == 7 and len(counting_cxx.compiles()) == 1


def _cli(*args, env: dict) -> subprocess.CompletedProcess:
    full = dict(os.environ, PYTHONPATH=ROOT, **env)
    return subprocess.run([sys.executable, "-m", "opforge.cli", "cache", *args], env=full, capture_output=True,
                          text=True, timeout=300, check=False)


def test_the_cli_pushes_lists_and_pulls_ahead_of_a_job(monkeypatch, tmp_path, source, counting_cxx):
    keydir = tmp_path / "keys"
    made = _cli("keygen", "ci", "--dir", str(keydir), env={})
    assert made.returncode == 0 and (keydir / "ci.secret").stat().st_mode & 0o777 == 0o600, made.stderr
    url = f"file://{tmp_path / 'store'}"
    monkeypatch.setenv("OPFORGE_CACHE_DIR", str(tmp_path / "node-a"))
    import opforge

    assert opforge.load("remote_mod", [str(source)]).value() == 7  # built with no store configured
    a = {"OPFORGE_CACHE_DIR": str(tmp_path / "node-a"), "OPFORGE_REMOTE_CACHE": url,
         "OPFORGE_SIGNING_KEY": str(keydir / "ci.secret")}
    pushed = _cli("push", "remote_mod", "--json", env=a)
    assert pushed.returncode == 0, pushed.stderr
    assert [e["status"] for e in json.loads(pushed.stdout)["entries"]] == ["pushed"]
    listed = json.loads(_cli("list", "--remote", "--json", env=a).stdout)
    assert [(e["name"], e["size"] > 0) for e in listed["entries"]] == [("remote_mod", True)]

    c = node_env(tmp_path, url, node="node-c", OPFORGE_TRUSTED_KEYS=str(keydir / "ci.public"))
    pulled = _cli("pull", "remote_mod", "--json", env=c)
    assert pulled.returncode == 0, pulled.stderr
    assert [e["status"] for e in json.loads(pulled.stdout)["entries"]] == ["imported"]
    got, _ = node_b(tmp_path, "", source, "remote_mod", node="node-c")  # no store now: a local hit, no compiler
    assert got["value"] == 7 and len(counting_cxx.compiles()) == 1

    none = _cli("pull", "remote_mod", env={"OPFORGE_REMOTE_CACHE": ""})
    assert none.returncode == 2 and "set OPFORGE_REMOTE_CACHE" in none.stderr


def test_keygen_writes_a_private_secret_and_refuses_to_overwrite(tmp_path):
    import opforge

    secret, public = signing.keygen("ci", str(tmp_path))
    assert oct(os.stat(secret).st_mode & 0o777) == "0o600"
    assert open(public).read().startswith("opforge-ed25519-public:ci:")
    with pytest.raises(opforge.OpforgeError, match="does not overwrite"):
        signing.keygen("ci", str(tmp_path))
    doc = signing.sign(b"manifest", secret)
    assert signing.verify(b"manifest", doc, signing.trusted([public]))
    assert not signing.verify(b"other", doc, signing.trusted([public]))
    with pytest.raises(opforge.OpforgeError, match="is not an opforge public key"):
        signing.trusted([secret])


def test_a_dead_store_is_asked_once_per_process(monkeypatch, tmp_path, silent_server, make_pymod, counting_cxx,
                                                 capfd):
    import opforge

    monkeypatch.setenv("OPFORGE_CACHE_DIR", str(tmp_path / "node"))
    monkeypatch.setenv("OPFORGE_REMOTE_CACHE", silent_server)
    monkeypatch.setenv("OPFORGE_REMOTE_TIMEOUT", "1.5")
    started = time.monotonic()
    assert opforge.load("slow_a", [str(make_pymod("slow_a", 3))]).value() == 3
    first = time.monotonic() - started
    started = time.monotonic()
    assert opforge.load("slow_b", [str(make_pymod("slow_b", 4))]).value() == 4
    second = time.monotonic() - started
    err = capfd.readouterr().err
    assert err.count("is not usable") == 1 and "no answer within 1.5 s (OPFORGE_REMOTE_TIMEOUT)" in err
    assert first >= 1.5 and second < first - 1.0  # the dead store is not asked again in this process
    assert len(counting_cxx.compiles()) == 2


def test_doctor_checks_the_store_and_the_keys(tmp_path, keys, silent_server):
    from opforge import settings
    from opforge.cli.remote_cmd import check_remote

    def verdicts(**env):
        return {c.name: (c.status, c.detail) for c in check_remote(settings.current(env))}

    assert verdicts() == {"remote cache": ("ok", "not set (OPFORGE_REMOTE_CACHE): builds stay on this machine")}
    url = f"file://{tmp_path / 'store'}"
    (tmp_path / "store").mkdir()  # a store that isn't there is "missing" (tests/remote/test_remote_objects.py)
    good = verdicts(OPFORGE_REMOTE_CACHE=url, OPFORGE_TRUSTED_KEYS=keys["public"], OPFORGE_REMOTE_PUSH="1",
                    OPFORGE_SIGNING_KEY=keys["secret"])
    assert good["remote cache"] == ("ok", f"{url}: reachable, 0 entries")
    assert good["trusted keys"] == ("ok", "pulls accept entries signed by node-a") and good["signing key"][0] == "ok"
    loose = verdicts(OPFORGE_REMOTE_CACHE=url, OPFORGE_REMOTE_PUSH="1")
    assert loose["trusted keys"][0] == "warn" and "every remote entry will be refused" in loose["trusted keys"][1]
    assert loose["signing key"][0] == "warn" and "pushes are refused" in loose["signing key"][1]
    swapped = verdicts(OPFORGE_REMOTE_CACHE=url, OPFORGE_TRUSTED_KEYS=keys["secret"])
    assert swapped["trusted keys"][0] == "fail" and "is not an opforge public key" in swapped["trusted keys"][1]
    remote_fs._DEAD.clear()
    dead = verdicts(OPFORGE_REMOTE_CACHE=silent_server, OPFORGE_REMOTE_TIMEOUT="1")
    assert dead["remote cache"] == ("fail", f"{silent_server}: no answer within 1 s (OPFORGE_REMOTE_TIMEOUT)")
    remote_fs._DEAD.clear()



def test_a_clients_own_timeout_reads_as_no_answer_and_other_errors_keep_their_name(capsys):
    """The store's client gets the same timeout as the wait for it, so on a busy machine its own
    timeout (httpx's ReadTimeout under webdav4) may fire first: the verdict is the same."""
    httpx = pytest.importorskip("httpx")
    from opforge import settings
    from opforge.engine.progress import Reporter

    url = "webdav://127.0.0.1:9/opforge"
    s = settings.current({"OPFORGE_REMOTE_CACHE": url, "OPFORGE_REMOTE_TIMEOUT": "1"})
    for exc, why in ((httpx.ReadTimeout("timed out"), "no answer within 1 s (OPFORGE_REMOTE_TIMEOUT)"),
                     (TimeoutError("slow"), "no answer within 1 s (OPFORGE_REMOTE_TIMEOUT)"),
                     (PermissionError("403 Forbidden"), "PermissionError: 403 Forbidden")):
        remote_fs._DEAD.clear()

        def fail(exc=exc):
            raise exc

        assert remote_fs._bounded(s, Reporter(False), "listing", fail) is None
        assert remote_fs._DEAD[url] == why
        assert f"(listing: {why}); building locally" in capsys.readouterr().err
    remote_fs._DEAD.clear()


def test_the_report_says_a_kernel_would_come_from_the_remote(monkeypatch, tmp_path, source, keys, counting_cxx):
    from opforge.cli.report_cmd import candidate_json
    from opforge.extension import CppExtension
    from opforge.loader import KernelLoader

    class Loader(KernelLoader):
        pass

    Loader.kind = "remote_report"  # set after creation: out of the global kind registry
    Ext = Loader.register_extension(type("Ext", (CppExtension,), {"name": "remote_mod", "kind": Loader.kind,
                                                                  "sources": (str(source),), "python_module": True,
                                                                  "optimize": (), "isa": CppExtension.isa}))
    url = f"file://{tmp_path / 'store'}"
    for k, v in {"OPFORGE_CACHE_DIR": str(tmp_path / "node-a"), "OPFORGE_REMOTE_CACHE": url,
                 "OPFORGE_REMOTE_PUSH": "1", "OPFORGE_SIGNING_KEY": keys["secret"]}.items():
        monkeypatch.setenv(k, v)
    (before,) = Loader().candidates()
    assert candidate_json(before)["remote"] is False  # the store holds nothing yet: it would be built
    Ext().build_jit()  # node A builds and pushes
    monkeypatch.setenv("OPFORGE_CACHE_DIR", str(tmp_path / "node-b"))
    (after,) = Loader().candidates()
    got = candidate_json(after)
    assert got["state"] == "needs build" and got["remote"] is True
    monkeypatch.delenv("OPFORGE_REMOTE_CACHE")
    assert candidate_json(Loader().candidates()[0])["remote"] is None


def test_a_store_that_cannot_be_opened_is_said_once_and_the_build_goes_on(monkeypatch, tmp_path, make_pymod,
                                                                          counting_cxx, capfd):
    import opforge

    remote_fs._DEAD.clear()
    monkeypatch.setenv("OPFORGE_CACHE_DIR", str(tmp_path / "node"))
    monkeypatch.setenv("OPFORGE_REMOTE_CACHE", "nosuchproto://bucket/opforge")  # no fsspec backend for it
    assert opforge.load("unopened", [str(make_pymod("unopened", 5))]).value() == 5
    err = capfd.readouterr().err
    assert err.count("is not usable (opening it: ") == 1 and len(counting_cxx.compiles()) == 1
    remote_fs._DEAD.clear()
