"""Stores for the remote cache's tests, started and stopped by the tests themselves, and two
"nodes" (each its own cache dir): A builds and pushes, B loads in a new process, by default with
no compiler (tests/remote, tests/faults/test_remote_faults.py).

* ``webdav``: WsgiDAV serving a temp dir on localhost (a real WebDAV server; webdav4 is the fsspec
  client), behind a middleware (``Misbehave``) that counts object downloads and misbehaves on
  request (500s, answers cut off, silence, slowness, objects deleted or tampered with), counting
  each fault it injected. ``serve_webdav`` starts one for a ``with`` block (a module's rounds).
* ``silent_server``: accepts connections and never answers (a store past its timeout); its URL
  counts the connections.
* ``tampered``: a pushed object with its signature stripped, forged or altered, or a bad manifest
  re-signed.
* ``s3``: moto's standalone server (the S3 protocol over HTTP on a local port) with a bucket,
  standing in for a real bucket; s3fs is the client.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import io
import json
import socket
import tarfile
import threading
import time

import pytest
from conftest import pymod_source, recorded_cache, run_python

import opforge
from opforge.engine import remote_fs, signing

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
    remote_fs._DEAD.clear()  # a store this process found dead in an earlier test is alive again
    monkeypatch.setenv("OPFORGE_CACHE_DIR", str(tmp_path / "node-a"))
    monkeypatch.setenv("OPFORGE_REMOTE_CACHE", url)
    monkeypatch.setenv("OPFORGE_REMOTE_PUSH", "1")
    if secret:
        monkeypatch.setenv("OPFORGE_SIGNING_KEY", secret)
    else:
        monkeypatch.delenv("OPFORGE_SIGNING_KEY", raising=False)
    assert opforge.load(name, [str(source)]).value() == value


def node_env(tmp_path, url, compiler=False, node="node-b", **env) -> dict:
    """The environment of a process of ``node``, whose cache (made here if new) holds torch's record, as a
    node's cache does after its first build (tests/conftest.py: recorded_cache): no torch import for the key."""
    recorded_cache(tmp_path / node)
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


def tar_with(data: bytes, change) -> bytes:
    """The tar ``data`` with each member's bytes passed through ``change(name, bytes)`` (None drops the member)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(data)) as src, tarfile.open(fileobj=out, mode="w") as dst:
        for m in src.getmembers():
            new = change(m.name, src.extractfile(m).read())
            if new is not None:
                m.size = len(new)
                dst.addfile(m, io.BytesIO(new))
    return out.getvalue()


def member(data: bytes, name: str) -> bytes:
    """The member of the tar ``data`` named ``name``, or whose name ends with it."""
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        (m,) = [m for m in tar.getmembers() if m.name == name or m.name.endswith(name)]
        return tar.extractfile(m).read()


def tampered(pristine: bytes, keys: dict) -> dict:
    """A's object (``pristine``, signed by ``keys["secret"]``) as a store or a man in the middle could
    change it: unsigned, signed by an untrusted key (``keys["other_secret"]``), its signature altered,
    and its manifest's sha256 wrong, re-signed by the trusted key (a signer that signed a bad manifest)."""
    manifest = member(pristine, "/manifest.json")

    def altered(name, data):
        if name != remote_fs.SIGNATURE:
            return data
        doc = json.loads(data)
        sig = bytearray(doc["signature"].encode())
        sig[5] = ord("A") if sig[5] != ord("A") else ord("B")
        return json.dumps(dict(doc, signature=sig.decode())).encode()

    bad = json.dumps(dict(json.loads(manifest), binary_sha256="0" * 64)).encode()

    def resigned(name, data):
        if name.endswith("/manifest.json"):
            return bad
        if name == remote_fs.SIGNATURE:
            return json.dumps(signing.sign(bad, keys["secret"])).encode()
        if name == "opforge-cache.json":
            index = json.loads(data)
            index["entries"][0]["files"]["manifest.json"] = {"size": len(bad), "sha256": hashlib.sha256(bad).hexdigest()}
            return json.dumps(index).encode()
        return data

    return {
        "unsigned": tar_with(pristine, lambda n, d: None if n == remote_fs.SIGNATURE else d),
        "signed by an untrusted key": tar_with(pristine, lambda n, d: json.dumps(signing.sign(
            manifest, keys["other_secret"])).encode() if n == remote_fs.SIGNATURE else d),
        "signature altered": tar_with(pristine, altered),
        "manifest sha256 wrong, re-signed": tar_with(pristine, resigned),
    }


class Misbehave:
    """WSGI middleware in front of the store. It logs every request (``log``: method and path), counts
    the GETs of ``.tar`` objects (``downloads``), injects faults, and counts each fault it actually
    injected (``injected``: fault -> times), so that a test counts the faults that struck, not those
    it only asked for.

    ``mode``, on every request until changed: "500" answers 500; "cut" sends half of each object's
    body, then drops the connection (a server killed mid-download).

    ``arm(fault, at, times, ...)``: the fault strikes the ``at``-th request it fits from now on
    (``objects=True``: the object downloads only; else any request) and the ``times - 1`` fitting
    ones after it (1: a passing fault, which a client's retry gets past; more: a lasting one):

    * "500": the server answers 500;
    * "cut": it sends ``fraction`` of the body, then drops the connection;
    * "silent": it holds the request with no answer until ``release()`` (then answers 503);
    * "slow": it answers ``delay`` seconds late; with ``pieces`` > 1, it sends the answer in that many
      pieces, ``delay`` seconds before each (a trickle: each read within a client's read timeout, the
      whole answer past it);
    * "delete": ``delete()`` runs first (deleting objects from the store's directory), then the
      request is served as the store now is;
    * "swap": the body is ``change(body)`` (a tampered, corrupt or truncated object), whole.

    ``label`` names the fault in ``injected`` (default: the fault)."""

    FAULTS = ("500", "cut", "silent", "slow", "delete", "swap")

    def __init__(self, app):
        self.app, self.mode, self.downloads = app, "ok", 0
        self.lock = threading.Lock()
        self.log: list[tuple[str, str]] = []
        self.injected: collections.Counter = collections.Counter()
        self.armed: dict | None = None
        self.released = threading.Event()

    def arm(self, fault: str, at: int = 1, times: int = 1, objects: bool = False, label: str | None = None,
            **how) -> None:
        assert fault in self.FAULTS and at >= 1 and times >= 1, (fault, at, times)
        with self.lock:
            self.armed = dict(how, fault=fault, left=at, times=times, objects=objects, label=label or fault)

    def release(self) -> None:
        """Disarm, and let every held request go."""
        with self.lock:
            self.armed = None
        self.released.set()
        self.released = threading.Event()

    def _strike(self, getting: bool) -> dict | None:
        with self.lock:
            armed = self.armed
            if armed is None or (armed["objects"] and not getting):
                return None
            armed["left"] -= 1
            if armed["left"] > 0:
                return None
            armed["times"] -= 1
            if armed["times"] == 0:
                self.armed = None
            else:
                armed["left"] = 1
            self.injected[armed["label"]] += 1
            return dict(armed, released=self.released)

    def __call__(self, environ, start_response):
        method, path = environ.get("REQUEST_METHOD", ""), environ.get("PATH_INFO", "")
        getting = method == "GET" and path.endswith(".tar")
        with self.lock:
            self.log.append((method, path))
            self.downloads += getting
            if self.mode == "500" or (self.mode == "cut" and getting):
                self.injected[self.mode] += 1
        if self.mode == "500":
            return self._500(start_response)
        fault = self._strike(getting)
        if fault is None:
            body = self.app(environ, start_response)
            return self._cut(body, 0.5) if self.mode == "cut" and getting else body
        kind = fault["fault"]
        if kind == "500":
            return self._500(start_response)
        if kind == "silent":
            fault["released"].wait(120)
            start_response("503 Service Unavailable", [("Content-Type", "text/plain"), ("Content-Length", "0")])
            return [b""]
        if kind == "slow":
            return self._slow(self.app(environ, start_response), fault["delay"], fault.get("pieces", 1))
        if kind == "delete":
            fault["delete"]()
        if kind == "swap":
            return self._swap(environ, start_response, fault["change"])
        body = self.app(environ, start_response)
        return self._cut(body, fault["fraction"]) if kind == "cut" else body

    @staticmethod
    def _500(start_response):
        start_response("500 Internal Server Error", [("Content-Type", "text/plain"), ("Content-Length", "4")])
        return [b"oops"]

    def _swap(self, environ, start_response, change):
        got, written = {}, []

        def capture(status, headers, exc_info=None):
            got.update(status=status, headers=headers)
            return written.append

        chunks = list(self.app(environ, capture))
        body = b"".join(written + chunks)
        if not got["status"].startswith("200"):
            start_response(got["status"], got["headers"])
            return [body]
        data = change(body)
        start_response(got["status"], [(k, v) for k, v in got["headers"] if k.lower() != "content-length"]
                       + [("Content-Length", str(len(data)))])
        return [data]

    @staticmethod
    def _slow(body, delay: float, pieces: int):
        data = b"".join(body)
        step = -(-len(data) // pieces) or 1
        for start in range(0, max(len(data), 1), step):
            time.sleep(delay)
            yield data[start:start + step]

    @staticmethod
    def _cut(body, fraction: float):
        data = b"".join(body)
        yield data[:int(len(data) * fraction)]
        raise ConnectionResetError("the server died mid-answer")


@pytest.fixture
def webdav(tmp_path):
    """(root dir, store URL, middleware): WsgiDAV on localhost, started and stopped here."""
    with serve_webdav(tmp_path / "dav") as started:
        yield started


@contextlib.contextmanager
def serve_webdav(root):
    """WsgiDAV serving ``root`` (made here) on localhost behind a ``Misbehave``, for the ``with``
    block: (root, store URL, middleware)."""
    pytest.importorskip("wsgidav")
    pytest.importorskip("webdav4")
    from cheroot import wsgi
    from wsgidav.wsgidav_app import WsgiDAVApp

    root.mkdir()
    app = Misbehave(WsgiDAVApp({"provider_mapping": {"/": str(root)}, "simple_dc": {"user_mapping": {"*": True}},
                                "verbose": 0, "logging": {"enable": False},
                                "http_authenticator": {"accept_basic": False}}))
    server = wsgi.Server(("127.0.0.1", 0), app, numthreads=16)
    server.prepare()
    thread = threading.Thread(target=server.serve, daemon=True)
    thread.start()
    try:
        yield root, f"webdav://127.0.0.1:{server.bind_addr[1]}/opforge", app
    finally:
        app.release()
        server.stop()
        thread.join(10)


class SilentURL(str):
    """The silent store's URL, which also says how many connections it accepted (and never answered)."""

    held: list

    @property
    def connections(self) -> int:
        return len(self.held)


@pytest.fixture
def silent_server():
    """A TCP server that accepts connections and never answers: a store past its timeout. Its URL
    (a ``SilentURL``) counts the connections."""
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
    url = SilentURL(f"webdav://127.0.0.1:{sock.getsockname()[1]}/opforge")
    url.held = held
    yield url
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
    import urllib.request

    # moto keeps its buckets in the process, across servers: each test starts from an empty S3
    urllib.request.urlopen(urllib.request.Request(f"http://{host}:{port}/moto-api/reset", method="POST"), timeout=30)
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
