"""The remote binary cache (issue 24, first step): node A builds and pushes, node B pulls and loads
with no compiler, against stores the tests start themselves: a directory (``file://``) and a real
WebDAV server (WsgiDAV on localhost, with the webdav4 fsspec client). Every refusal (unsigned,
wrongly signed, tampered, a dead store) is followed by a correct local build, and nothing refused
is published."""

from __future__ import annotations

import io
import json
import os
import socket
import tarfile
import threading
import time

import pytest
from conftest import pymod_source, run_python

pytest.importorskip("fsspec")
pytest.importorskip("cryptography")

import opforge  # noqa: E402
from opforge.engine import remote, signing  # noqa: E402

USE = """
import json, opforge
m = opforge.load(NAME, [SOURCE])
print(json.dumps({"value": m.value(), "file": m.__file__}))
"""


@pytest.fixture
def keys(tmp_path):
    a = signing.keygen("node-a", str(tmp_path / "keys"))
    b = signing.keygen("intruder", str(tmp_path / "keys"))
    return {"secret": a[0], "public": a[1], "other_secret": b[0], "other_public": b[1]}


@pytest.fixture(autouse=True)
def _fresh_store_state():
    remote._DEAD.clear()
    yield
    remote._DEAD.clear()


def node_a(monkeypatch, tmp_path, url, source, name, secret=None):
    """Build ``name`` in node A's own cache and push it."""
    monkeypatch.setenv("OPFORGE_CACHE_DIR", str(tmp_path / "node-a"))
    monkeypatch.setenv("OPFORGE_REMOTE_CACHE", url)
    monkeypatch.setenv("OPFORGE_REMOTE_PUSH", "1")
    if secret:
        monkeypatch.setenv("OPFORGE_SIGNING_KEY", secret)
    else:
        monkeypatch.delenv("OPFORGE_SIGNING_KEY", raising=False)
    assert opforge.load(name, [str(source)]).value() == 7


def node_b(tmp_path, url, source, name, compiler=False, **env) -> tuple[dict, str]:
    """Load ``name`` in a new process with node B's own cache (and, by default, no compiler)."""
    full = {"OPFORGE_CACHE_DIR": str(tmp_path / "node-b"), "OPFORGE_REMOTE_CACHE": url, "OPFORGE_REMOTE_PUSH": "0",
            **env}
    if not compiler:
        full.update(CXX="/nonexistent/c++", PATH="/nonexistent")
    code = USE.replace("NAME", repr(name)).replace("SOURCE", repr(str(source)))
    out = run_python(code, env=full, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1]), out.stderr


def objects(store) -> list:
    return sorted(p for p in store.rglob("*.tar") if not p.name.startswith("."))


@pytest.fixture
def source(tmp_path):
    path = tmp_path / "src" / "remote_mod.cpp"
    path.parent.mkdir()
    path.write_text(pymod_source("remote_mod", 7))
    return path


def test_node_b_with_no_compiler_loads_what_node_a_built_and_pushed(monkeypatch, tmp_path, source, keys,
                                                                    counting_cxx):
    store = tmp_path / "store"
    url = f"file://{store}"
    node_a(monkeypatch, tmp_path, url, source, "remote_mod", keys["secret"])
    assert len(counting_cxx.compiles()) == 1
    (obj,) = objects(store)
    assert obj.parent.parent.name == "remote_mod" and obj.parent.parent.parent.name == remote.PREFIX
    got, err = node_b(tmp_path, url, source, "remote_mod", OPFORGE_TRUSTED_KEYS=keys["public"])
    assert got["value"] == 7 and got["file"].startswith(str(tmp_path / "node-b"))
    assert len(counting_cxx.compiles()) == 1  # node B compiled nothing
    warm, _ = node_b(tmp_path, url, source, "remote_mod", OPFORGE_TRUSTED_KEYS=keys["public"],
                     OPFORGE_REMOTE_CACHE="file:///nonexistent/store")  # now a local hit: the store isn't asked
    assert warm["file"] == got["file"]


@pytest.mark.parametrize("case", ["unsigned", "wrong key", "tampered binary"])
def test_a_refused_entry_is_said_never_published_and_node_b_builds_it(monkeypatch, tmp_path, source, keys,
                                                                      counting_cxx, case):
    store = tmp_path / "store"
    url = f"file://{store}"
    node_a(monkeypatch, tmp_path, url, source, "remote_mod",
           {"unsigned": None, "wrong key": keys["other_secret"], "tampered binary": keys["secret"]}[case])
    if case == "tampered binary":  # the same index and manifest, another binary: its sha256 gives it away
        (obj,) = objects(store)
        rewrite(obj, lambda name, data: data[:-64] + bytes(64) if name.endswith(".so") else data)
    got, err = node_b(tmp_path, url, source, "remote_mod", compiler=True, OPFORGE_TRUSTED_KEYS=keys["public"])
    assert got["value"] == 7 and len(counting_cxx.compiles()) == 2  # built locally, correctly
    why = {"unsigned": "it is unsigned: sign pushes with OPFORGE_SIGNING_KEY",
           "wrong key": "its signature (by 'intruder') does not verify with any trusted key (node-a)",
           "tampered binary": "sha256 mismatch"}[case]
    assert "refused" in err and why in err, err


def test_unsigned_entries_load_when_explicitly_allowed(monkeypatch, tmp_path, source, counting_cxx):
    url = f"file://{tmp_path / 'store'}"
    node_a(monkeypatch, tmp_path, url, source, "remote_mod")
    got, _ = node_b(tmp_path, url, source, "remote_mod", OPFORGE_REMOTE_ALLOW_UNSIGNED="1")
    assert got["value"] == 7 and len(counting_cxx.compiles()) == 1


def rewrite(obj, change):
    """Rewrite a tar object member by member through ``change(name, data)``."""
    with tarfile.open(obj) as tar:
        members = [(m, tar.extractfile(m).read()) for m in tar.getmembers()]
    with tarfile.open(obj, "w") as tar:
        for m, data in members:
            data = change(m.name, data)
            m.size = len(data)
            tar.addfile(m, io.BytesIO(data))


@pytest.fixture
def silent_server():
    """A TCP server that accepts connections and never answers: a store past its timeout."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    held = []
    stop = threading.Event()

    def accept():
        sock.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(sock.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"webdav://127.0.0.1:{sock.getsockname()[1]}/opforge"
    stop.set()
    thread.join()
    for c in held:
        c.close()
    sock.close()


def test_a_store_past_its_timeout_costs_that_once_then_the_build_goes_on(monkeypatch, tmp_path, silent_server,
                                                                         make_pymod, counting_cxx, capfd):
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


@pytest.fixture
def webdav(tmp_path):
    """WsgiDAV serving a temp dir on localhost: a real WebDAV server, started and stopped here."""
    pytest.importorskip("wsgidav")
    pytest.importorskip("webdav4")
    from cheroot import wsgi
    from wsgidav.wsgidav_app import WsgiDAVApp

    root = tmp_path / "dav"
    root.mkdir()
    app = WsgiDAVApp({"provider_mapping": {"/": str(root)}, "simple_dc": {"user_mapping": {"*": True}},
                      "verbose": 0, "logging": {"enable": False}, "http_authenticator": {"accept_basic": False}})
    server = wsgi.Server(("127.0.0.1", 0), app)
    server.prepare()
    thread = threading.Thread(target=server.serve, daemon=True)
    thread.start()
    yield root, f"webdav://127.0.0.1:{server.bind_addr[1]}/opforge"
    server.stop()
    thread.join(10)


def test_over_webdav_node_a_pushes_and_node_b_pulls(monkeypatch, tmp_path, source, keys, webdav, counting_cxx):
    root, url = webdav
    node_a(monkeypatch, tmp_path, url, source, "remote_mod", keys["secret"])
    (obj,) = objects(root)
    assert obj.relative_to(root).parts[:3] == ("opforge", remote.PREFIX, "remote_mod")
    got, _ = node_b(tmp_path, url, source, "remote_mod", OPFORGE_TRUSTED_KEYS=keys["public"])
    assert got["value"] == 7 and len(counting_cxx.compiles()) == 1


def test_keygen_writes_a_private_secret_and_refuses_to_overwrite(tmp_path):
    secret, public = signing.keygen("ci", str(tmp_path))
    assert oct(os.stat(secret).st_mode & 0o777) == "0o600" and open(public).read().startswith("opforge-ed25519-public:ci:")
    with pytest.raises(opforge.OpforgeError, match="does not overwrite"):
        signing.keygen("ci", str(tmp_path))
    doc = signing.sign(b"manifest", secret)
    assert signing.verify(b"manifest", doc, signing.trusted([public]))
    assert not signing.verify(b"other", doc, signing.trusted([public]))
    with pytest.raises(opforge.OpforgeError, match="is not an opforge public key"):
        signing.trusted([secret])
