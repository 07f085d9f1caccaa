"""Stores for the remote cache's tests, started and stopped by the tests themselves, and two
"nodes" (each its own cache dir): A builds and pushes, B loads in a new process, by default with
no compiler (tests/remote, tests/faults/test_remote_faults.py).

* ``webdav``: WsgiDAV serving a temp dir on localhost (a real WebDAV server; webdav4 is the fsspec
  client), behind a middleware that counts object downloads and can misbehave on request: answer
  500 to everything, or cut an object's download off halfway (a server killed mid-download).
* ``silent_server``: accepts connections and never answers (a store past its timeout).
* ``s3``: moto's standalone server (the S3 protocol over HTTP on a local port) with a bucket,
  standing in for a real bucket; s3fs is the client.
"""

from __future__ import annotations

import io
import json
import socket
import tarfile
import threading

import pytest
from conftest import pymod_source, run_python

import opforge
from opforge.engine import remote, signing

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


@pytest.fixture
def source(tmp_path):
    path = tmp_path / "src" / "remote_mod.cpp"
    path.parent.mkdir()
    path.write_text(pymod_source("remote_mod", 7))
    return path


def node_a(monkeypatch, tmp_path, url, source, name, secret=None, value=7):
    """Build ``name`` in node A's own cache and push it."""
    remote._DEAD.clear()  # a store this process found dead in an earlier test is alive again
    monkeypatch.setenv("OPFORGE_CACHE_DIR", str(tmp_path / "node-a"))
    monkeypatch.setenv("OPFORGE_REMOTE_CACHE", url)
    monkeypatch.setenv("OPFORGE_REMOTE_PUSH", "1")
    if secret:
        monkeypatch.setenv("OPFORGE_SIGNING_KEY", secret)
    else:
        monkeypatch.delenv("OPFORGE_SIGNING_KEY", raising=False)
    assert opforge.load(name, [str(source)]).value() == value


def node_env(tmp_path, url, compiler=False, node="node-b", **env) -> dict:
    full = {"OPFORGE_CACHE_DIR": str(tmp_path / node), "OPFORGE_REMOTE_CACHE": url, "OPFORGE_REMOTE_PUSH": "0",
            "OPFORGE_REMOTE_TIMEOUT": "20", **env}
    if not compiler:
        full.update(CXX="/nonexistent/c++", PATH="/nonexistent")
    return full


def node_b(tmp_path, url, source, name, compiler=False, **env) -> tuple[dict, str]:
    """Load ``name`` in a new process with node B's own cache (and, by default, no compiler)."""
    code = USE.replace("NAME", repr(name)).replace("SOURCE", repr(str(source)))
    out = run_python(code, env=node_env(tmp_path, url, compiler, **env), timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1]), out.stderr


def objects(store) -> list:
    return sorted(p for p in store.rglob("*.tar") if not p.name.startswith("."))


def rewrite(obj, change):
    """Rewrite a tar object member by member through ``change(name, data)``."""
    with tarfile.open(obj) as tar:
        members = [(m, tar.extractfile(m).read()) for m in tar.getmembers()]
    with tarfile.open(obj, "w") as tar:
        for m, data in members:
            data = change(m.name, data)
            m.size = len(data)
            tar.addfile(m, io.BytesIO(data))


class Misbehave:
    """WSGI middleware: counts GETs of ``.tar`` objects; ``mode`` "500" answers 500 to every request,
    "cut" sends half of an object's body and then drops the connection."""

    def __init__(self, app):
        self.app, self.mode, self.downloads = app, "ok", 0
        self.lock = threading.Lock()

    def __call__(self, environ, start_response):
        getting = environ.get("REQUEST_METHOD") == "GET" and environ.get("PATH_INFO", "").endswith(".tar")
        if getting:
            with self.lock:
                self.downloads += 1
        if self.mode == "500":
            start_response("500 Internal Server Error", [("Content-Type", "text/plain"), ("Content-Length", "4")])
            return [b"oops"]
        body = self.app(environ, start_response)
        if self.mode == "cut" and getting:
            return self._cut(body)
        return body

    @staticmethod
    def _cut(body):
        data = b"".join(body)
        yield data[:len(data) // 2]
        raise ConnectionResetError("the server died mid-download")


@pytest.fixture
def webdav(tmp_path):
    """(root dir, store URL, middleware): WsgiDAV on localhost, started and stopped here."""
    pytest.importorskip("wsgidav")
    pytest.importorskip("webdav4")
    from cheroot import wsgi
    from wsgidav.wsgidav_app import WsgiDAVApp

    root = tmp_path / "dav"
    root.mkdir()
    app = Misbehave(WsgiDAVApp({"provider_mapping": {"/": str(root)}, "simple_dc": {"user_mapping": {"*": True}},
                                "verbose": 0, "logging": {"enable": False},
                                "http_authenticator": {"accept_basic": False}}))
    server = wsgi.Server(("127.0.0.1", 0), app, numthreads=16)
    server.prepare()
    thread = threading.Thread(target=server.serve, daemon=True)
    thread.start()
    yield root, f"webdav://127.0.0.1:{server.bind_addr[1]}/opforge", app
    server.stop()
    thread.join(10)


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


@pytest.fixture
def s3(monkeypatch):
    """moto's S3 server on localhost with a bucket: (store URL, env for s3fs)."""
    pytest.importorskip("s3fs")
    moto_server = pytest.importorskip("moto.server")
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    env = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1",
           "FSSPEC_S3_ENDPOINT_URL": f"http://{host}:{port}"}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    import boto3

    boto3.client("s3", endpoint_url=env["FSSPEC_S3_ENDPOINT_URL"], region_name="us-east-1").create_bucket(Bucket="opforge")
    yield "s3://opforge/cache", env
    server.stop()


FIXTURES = ("keys", "s3", "silent_server", "source", "webdav")
"""Made available to every test by tests/conftest.py."""
