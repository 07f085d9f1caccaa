"""The remote cache's objects never change once written, and its misses and typos are errors (issue 34,
items 2 and 3, and the store's prune of item 5), against the stores the tests start: a directory
(``file://``), WsgiDAV and moto's S3 server, through the real CLI (``python -m opforge.cli``).

Two tiny modules are built once for the module (``built``); each test copies that cache as its node A."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import threading
import time

import pytest
from conftest import ROOT, pymod_source, run_python

pytest.importorskip("fsspec")
pytest.importorskip("cryptography")

from opforge.engine import archive, remote, remote_fs, remote_prune, remote_push, signing  # noqa: E402

DAY = 86400.0


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A cache holding remote_mod (7) and remote_two (5), built once, with no store: (sources, cache)."""
    base = tmp_path_factory.mktemp("built")
    sources = {}
    for name, value in (("remote_mod", 7), ("remote_two", 5)):
        sources[name] = base / "src" / f"{name}.cpp"
        sources[name].parent.mkdir(exist_ok=True)
        sources[name].write_text(pymod_source(name, value))
    code = ("import opforge\n"
            + "".join(f"assert opforge.load({n!r}, [{str(p)!r}]).value() == {v}\n"
                      for (n, p), v in zip(sources.items(), (7, 5))))
    out = run_python(code, env={"OPFORGE_CACHE_DIR": str(base / "cache"), "OPFORGE_REMOTE_CACHE": ""})
    assert out.returncode == 0, out.stderr[-3000:]
    return sources, base / "cache"


def copy_cache(tmp_path, built) -> str:
    """A copy of the built cache: this test's node A."""
    dest = tmp_path / "node-a"
    shutil.copytree(built[1], dest, symlinks=True)
    return str(dest)


class Store:
    """A store of one kind, started for the test: its URL, the env its clients need, and a look at its objects
    that goes around opforge (the directory served, or boto3)."""

    def __init__(self, kind: str, url: str, env: dict, directory=None, bucket=None):
        self.kind, self.url, self.env, self.directory, self.bucket = kind, url, env, directory, bucket

    def objects(self) -> dict[str, bytes]:
        """Every object (not the dot-named uploads): path below the store's root -> bytes."""
        if self.bucket is not None:
            client, name, prefix = self.bucket
            listed = client.list_objects_v2(Bucket=name, Prefix=prefix).get("Contents", [])
            return {o["Key"][len(prefix):].lstrip("/"): client.get_object(Bucket=name, Key=o["Key"])["Body"].read()
                    for o in listed if o["Key"].endswith(".tar") and not o["Key"].rsplit("/", 1)[-1].startswith(".")}
        if not self.directory.is_dir():
            return {}
        return {str(p.relative_to(self.directory)): p.read_bytes() for p in sorted(self.directory.rglob("*.tar"))
                if not p.name.startswith(".")}

    def leftovers(self) -> list[str]:
        if self.bucket is not None:
            client, name, prefix = self.bucket
            listed = client.list_objects_v2(Bucket=name, Prefix=prefix).get("Contents", [])
            return [o["Key"] for o in listed if o["Key"].rsplit("/", 1)[-1].startswith(".")]
        return [str(p) for p in self.directory.rglob(".*")] if self.directory.is_dir() else []


@pytest.fixture(params=["file", "webdav", "s3"])
def store(request, tmp_path, monkeypatch):
    kind = request.param
    if kind == "file":
        return Store(kind, f"file://{tmp_path / 'store'}", {}, directory=tmp_path / "store")
    if kind == "webdav":
        root, url, _ = request.getfixturevalue("webdav")
        return Store(kind, url, {}, directory=root / "opforge")
    _, env = request.getfixturevalue("s3")
    import boto3
    import fsspec

    monkeypatch.setitem(fsspec.config.conf, "s3", {"endpoint_url": env["FSSPEC_S3_ENDPOINT_URL"]})
    client = boto3.client("s3", endpoint_url=env["FSSPEC_S3_ENDPOINT_URL"], region_name="us-east-1")
    prefix = tmp_path.name  # moto's buckets live in this process, from one server to the next: a prefix per test
    return Store(kind, f"s3://opforge/{prefix}", env, bucket=(client, "opforge", prefix))


def cli(*args, env: dict, cwd=None) -> subprocess.CompletedProcess:
    """``python -m opforge.cli cache ARGS`` with ``env`` over this environment, less the remote cache's own
    variables (each test says which it sets)."""
    full = {k: v for k, v in os.environ.items() if not k.startswith(("OPFORGE_REMOTE", "OPFORGE_SIGNING",
                                                                       "OPFORGE_TRUSTED"))}
    full.update(PYTHONPATH=ROOT, **env)
    return subprocess.run([sys.executable, "-m", "opforge.cli", "cache", *args], env=full, capture_output=True,
                          text=True, timeout=300, check=False, cwd=cwd)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# -- item 2: objects never change once written ------------------------------------------------------


def test_a_push_never_replaces_an_object_and_the_signed_one_stays_byte_for_byte(store, tmp_path, built, keys):
    a = {"OPFORGE_CACHE_DIR": copy_cache(tmp_path, built), "OPFORGE_REMOTE_CACHE": store.url, **store.env}
    first = cli("push", "remote_mod", "--json", env=dict(a, OPFORGE_SIGNING_KEY=keys["secret"]))
    assert first.returncode == 0, first.stderr
    assert [e["status"] for e in json.loads(first.stdout)["entries"]] == ["pushed"]
    ((path, signed),) = store.objects().items()
    assert json.loads(tarfile.open(fileobj=io.BytesIO(signed)).extractfile(remote_fs.SIGNATURE).read())["key"] == "node-a"

    unsigned = cli("push", "remote_mod", "--json", env=dict(a, OPFORGE_REMOTE_ALLOW_UNSIGNED="1"))
    intruder = cli("push", "remote_mod", "--json", env=dict(a, OPFORGE_SIGNING_KEY=keys["other_secret"]))
    for done in (unsigned, intruder):
        assert done.returncode == 0, done.stderr
        (row,) = json.loads(done.stdout)["entries"]
        assert row["status"] == "present" and "objects are immutable" in row["reason"], row
    assert {p: sha(b) for p, b in store.objects().items()} == {path: sha(signed)}  # byte for byte the signed one
    assert store.leftovers() == []


def test_a_racing_push_that_passed_the_check_does_not_replace_the_object(store, tmp_path):
    """Two pushers both saw no object; the second to place it must find the first's there (the
    conditional create: S3's If-None-Match, link(2), WebDAV's MOVE with Overwrite: F)."""
    fs, root = remote_fs._fs(store.url)
    final = f"{root}/{remote_fs.PREFIX}/race/k/0123456789abcdef-01234567.tar"
    fs.makedirs(final.rsplit("/", 1)[0], exist_ok=True)
    for n, text in enumerate((b"first, signed", b"second, unsigned")):
        (tmp_path / f"{n}.tar").write_bytes(text)
    assert remote_fs._place(fs, str(tmp_path / "0.tar"), final) is True
    assert remote_fs._place(fs, str(tmp_path / "1.tar"), final) is False
    assert list(store.objects().values()) == [b"first, signed"] and store.leftovers() == []


def test_racing_pushes_to_a_directory_place_one_object(tmp_path):
    """Eight threads place different bytes under one name at once: link(2) lets exactly one win."""
    fs, root = remote_fs._fs(f"file://{tmp_path / 'store'}")
    final = f"{root}/{remote_fs.PREFIX}/race/k/0123456789abcdef-01234567.tar"
    fs.makedirs(final.rsplit("/", 1)[0], exist_ok=True)
    start, won = threading.Barrier(8), {}

    def push(n):
        (tmp_path / f"{n}.tar").write_bytes(b"object %d" % n)
        start.wait()
        won[n] = remote_fs._place(fs, str(tmp_path / f"{n}.tar"), final)

    threads = [threading.Thread(target=push, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    (winner,) = [n for n, placed in won.items() if placed]
    assert len(won) == 8 and open(final, "rb").read() == b"object %d" % winner
    assert [p.name for p in (tmp_path / "store").rglob(".*")] == []


def test_an_unsigned_push_is_refused_with_the_fix(tmp_path, built, make_pymod):
    url = f"file://{tmp_path / 'store'}"
    a = {"OPFORGE_CACHE_DIR": copy_cache(tmp_path, built), "OPFORGE_REMOTE_CACHE": url}
    refused = cli("push", env=a)
    assert refused.returncode == 2 and refused.stdout == "", refused
    (line,) = refused.stderr.strip().splitlines()
    for fix in ("opforge cache keygen NAME", "OPFORGE_SIGNING_KEY=NAME.secret", "OPFORGE_REMOTE_ALLOW_UNSIGNED=1"):
        assert fix in line, line
    assert not (tmp_path / "store").exists()

    # after a build (OPFORGE_REMOTE_PUSH=1): the builds succeed, one notice for the process, nothing pushed
    code = "import opforge\n" + "".join(f"assert opforge.load({n!r}, [{str(make_pymod(n, v))!r}]).value() == {v}\n"
                                        for n, v in (("pushed_one", 1), ("pushed_two", 2)))
    out = run_python(code, env={"OPFORGE_CACHE_DIR": str(tmp_path / "builder"), "OPFORGE_REMOTE_CACHE": url,
                                "OPFORGE_REMOTE_PUSH": "1", "OPFORGE_SIGNING_KEY": "",
                                "OPFORGE_REMOTE_ALLOW_UNSIGNED": ""})
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stderr.count("not pushing to the remote cache") == 1 and "opforge cache keygen" in out.stderr
    assert not (tmp_path / "store").exists()


@pytest.mark.parametrize("bad", ["a public key", "no such file"])
def test_a_bad_signing_key_is_one_message_and_exit_2(tmp_path, built, keys, capfd, bad):
    key = keys["public"] if bad == "a public key" else str(tmp_path / "nope.secret")
    said = "is not an opforge secret key" if bad == "a public key" else "cannot read the key file"
    cache = copy_cache(tmp_path, built)
    url = f"file://{tmp_path / 'store'}"
    out = cli("push", env={"OPFORGE_CACHE_DIR": cache, "OPFORGE_REMOTE_CACHE": url, "OPFORGE_SIGNING_KEY": key})
    assert out.returncode == 2 and out.stdout == "", out  # two entries, no table
    (line,) = out.stderr.strip().splitlines()
    assert said in line and key in line and "keygen" in line, line

    # after builds in one process: one notice, however many pushes
    from opforge import settings
    from opforge.engine import cache as cache_mod
    from opforge.engine import inventory
    from opforge.engine.progress import Reporter

    s = settings.current({"OPFORGE_CACHE_DIR": cache, "OPFORGE_REMOTE_CACHE": url, "OPFORGE_SIGNING_KEY": key})
    reporter = Reporter(False)
    capfd.readouterr()
    for row in inventory.entries(cache):
        for _ in range(2):
            assert remote_push.push(cache_mod.Entry(row.path, cache_mod.read_manifest(row.path)), s, reporter) is None
    assert capfd.readouterr().err.count(said) == 1
    assert not (tmp_path / "store").exists()


# -- item 2: the report predicts what a pull would do -----------------------------------------------------


def _object(name: str, entry: str, binary_size: int, secret: str | None) -> bytes:
    """A one-entry object as a push writes it (index, signature, binary, manifest), with a stand-in binary."""
    manifest = json.dumps({"name": name, "stand-in": True}).encode()
    members = {archive.INDEX: json.dumps({"format": archive.FORMAT, "entries": [
        {"name": name, "entry": entry, "binary": f"{name}.so", "files": {}}]}).encode()}
    if secret:
        members[remote_fs.SIGNATURE] = json.dumps(signing.sign(manifest, secret)).encode()
    members[f"entries/{name}/{entry}/{name}.so"] = os.urandom(binary_size)
    members[f"entries/{name}/{entry}/manifest.json"] = manifest
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for arcname, data in members.items():
            info = tarfile.TarInfo(arcname)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _count_bytes(server) -> dict:
    """Count the bytes the WebDAV server sends in answer to GETs of objects."""
    inner, sent = server.app, {"bytes": 0, "gets": 0}

    def counted(body):
        try:
            for chunk in body:
                sent["bytes"] += len(chunk)
                yield chunk
        finally:
            getattr(body, "close", lambda: None)()

    def app(environ, start_response):
        body = inner(environ, start_response)
        if environ["REQUEST_METHOD"] == "GET" and environ["PATH_INFO"].endswith(".tar"):
            sent["gets"] += 1
            return counted(body)
        return body

    server.app = app
    return sent


def test_the_report_predicts_what_a_pull_would_do_reading_only_the_signature(monkeypatch, tmp_path, keys, webdav,
                                                                            make_pymod):
    from opforge.cli.report_cmd import candidate_detail, candidate_json
    from opforge.extension import CppExtension
    from opforge.loader import KernelLoader

    class Loader(KernelLoader):
        pass

    Loader.kind = "remote_predict"  # set after creation: out of the global kind registry
    Loader.register_extension(type("Ext", (CppExtension,), {"name": "predicted", "kind": Loader.kind,
                                                            "sources": (str(make_pymod("predicted", 3)),),
                                                            "python_module": True, "optimize": (),
                                                            "isa": CppExtension.isa}))
    root, url, server = webdav
    remote_fs._DEAD.clear()
    monkeypatch.setenv("OPFORGE_CACHE_DIR", str(tmp_path / "node-b"))
    monkeypatch.setenv("OPFORGE_REMOTE_CACHE", url)
    for var in ("OPFORGE_TRUSTED_KEYS", "OPFORGE_REMOTE_ALLOW_UNSIGNED", "OPFORGE_SIGNING_KEY"):
        monkeypatch.delenv(var, raising=False)
    (c,) = Loader().candidates()
    spec = c.status.spec
    assert candidate_json(c)["remote"] is False and candidate_json(c)["remote_pull"] is None
    entry = f"{spec.input_key[:16]}-0badc0de"
    obj = root / "opforge" / remote_fs.PREFIX / spec.name / spec.portable_key / f"{entry}.tar"
    obj.parent.mkdir(parents=True)
    size = 4 * 2**20
    sent = _count_bytes(server)

    def predicted(secret, **env):
        obj.write_bytes(_object(spec.name, entry, size, secret))
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        got = candidate_json(Loader().candidates()[0])
        for k in env:
            monkeypatch.delenv(k)
        assert got["remote"] is True and got["state"] == "needs build", got
        return got["remote_pull"], candidate_detail(got)

    pull, detail = predicted(None, OPFORGE_TRUSTED_KEYS=keys["public"])
    assert pull.startswith("refused: unsigned") and "so it would be built" in detail and "not built" not in detail
    pull, detail = predicted(keys["other_secret"], OPFORGE_TRUSTED_KEYS=keys["public"])
    assert pull.startswith("refused: untrusted key") and "'intruder'" in pull and "so it would be built" in detail
    pull, _ = predicted(keys["secret"])  # signed, but no key trusted
    assert pull.startswith("refused: untrusted key") and "no key is trusted" in pull
    pull, detail = predicted(keys["secret"], OPFORGE_TRUSTED_KEYS=keys["public"])
    assert pull == "would be pulled (signed by node-a)" and detail.endswith("would be pulled (signed by node-a), not built")
    pull, _ = predicted(None, OPFORGE_REMOTE_ALLOW_UNSIGNED="1")
    assert pull.startswith("would be pulled (unsigned, allowed")
    # each prediction read two or three ranges (the headers, signature and manifest), never the 4 MiB binary
    assert 5 <= sent["gets"] <= 15 and sent["bytes"] <= 15 * remote_fs.PEEK_BLOCK < size, sent


def test_peek_reads_an_objects_signature_in_every_store(store, keys):
    fs, root = remote_fs._fs(store.url)
    path = f"{root}/{remote_fs.PREFIX}/peeked/k/0123456789abcdef-01234567.tar"
    fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
    fs.pipe_file(path, _object("peeked", "0123456789abcdef-01234567", 300_000, keys["secret"]))
    name, entry, manifest, doc = remote._peek(fs, path)
    assert (name, entry, doc["key"]) == ("peeked", "0123456789abcdef-01234567", "node-a")
    assert signing.verify(manifest, doc, signing.trusted([keys["public"]]))
    fs.pipe_file(path, b"not a tar at all" * 100)
    assert remote._peek(fs, path) is False


# -- item 3: misses and typos are errors --------------------------------------------------------------


def test_a_pull_that_finds_nothing_exits_1_and_says_where_it_looked(tmp_path):
    store = tmp_path / "store"
    (store / remote_fs.PREFIX / "remote_mod").mkdir(parents=True)
    env = {"OPFORGE_CACHE_DIR": str(tmp_path / "node"), "OPFORGE_REMOTE_CACHE": f"file://{store}"}
    out = cli("pull", "does_not_exist", env=env)
    assert out.returncode == 1, out
    assert f"{store}/{remote_fs.PREFIX}/does_not_exist/" in out.stdout and f"file://{store}" in out.stdout, out.stdout
    assert "1 missing" in out.stdout
    js = cli("pull", "does_not_exist", "remote_mod", "--json", env=env)
    assert js.returncode == 1 and [e["status"] for e in json.loads(js.stdout)["entries"]] == ["missing", "missing"]


@pytest.mark.parametrize("kind", ["file", "webdav", "s3"])
def test_a_store_root_that_is_not_there_is_missing(request, tmp_path, kind):
    from opforge import settings
    from opforge.cli.remote_cmd import check_remote

    remote_fs._DEAD.clear()
    env: dict = {}
    if kind == "file":
        url, make = f"file://{tmp_path / 'nope'}", lambda: (tmp_path / "nope").mkdir()
        what = f"no directory {tmp_path / 'nope'}"
    elif kind == "webdav":
        root, url, _ = request.getfixturevalue("webdav")
        make, what = lambda: (root / "opforge").mkdir(), "no directory /opforge"
    else:
        good, env = request.getfixturevalue("s3")
        import fsspec

        request.getfixturevalue("monkeypatch").setitem(fsspec.config.conf, "s3",
                                                       {"endpoint_url": env["FSSPEC_S3_ENDPOINT_URL"]})
        url, make, what = "s3://nobucket/cache", None, "no bucket 'nobucket'"
    full = {"OPFORGE_CACHE_DIR": str(tmp_path / "node"), "OPFORGE_REMOTE_CACHE": url, **env}
    (check,) = [c for c in check_remote(settings.current(full)) if c.name == "remote cache"]
    assert check.status == "fail" and check.detail == f"{url}: missing ({what})" and "typo" in check.fix, check
    for args in (("list", "--remote"), ("pull", "remote_mod"), ("prune", "--remote", "--older-than", "30")):
        out = cli(*args, env=full)
        assert out.returncode == 1 and f"does not exist ({what})" in out.stderr, (args, out)
    if make:
        make()
    else:  # the bucket is there, the prefix not yet: an empty store
        url = full["OPFORGE_REMOTE_CACHE"] = good
    (check,) = [c for c in check_remote(settings.current(full)) if c.name == "remote cache"]
    assert (check.status, check.detail) == ("ok", f"{url}: reachable, 0 entries")
    listed = cli("list", "--remote", env=full)
    assert listed.returncode == 0 and "holds nothing" in listed.stdout, listed


def test_a_relative_file_url_is_refused_with_the_fix(monkeypatch, tmp_path, built, keys, capfd):
    from opforge import settings
    from opforge.cli.remote_cmd import check_remote
    from opforge.engine import cache as cache_mod
    from opforge.engine import inventory
    from opforge.engine.progress import Reporter

    cwd = tmp_path / "cwd"
    cwd.mkdir()
    cache = copy_cache(tmp_path, built)
    env = {"OPFORGE_CACHE_DIR": cache, "OPFORGE_REMOTE_CACHE": "file://tmp/x", "OPFORGE_SIGNING_KEY": keys["secret"]}
    for args in (("push",), ("pull", "remote_mod"), ("list", "--remote"), ("prune", "--remote", "--older-than", "9")):
        out = cli(*args, env=env, cwd=cwd)
        assert out.returncode == 2, (args, out)
        assert "names a relative path" in out.stderr and "file:///tmp/x" in out.stderr, out.stderr
    (check,) = [c for c in check_remote(settings.current(env)) if c.name == "remote cache"]
    assert check.status == "fail" and "file:///abs/path" in check.fix

    # a push after a build, from that directory: a notice naming the fix, nothing written under it
    remote_fs._DEAD.clear()
    monkeypatch.chdir(cwd)
    row = inventory.entries(cache)[0]
    capfd.readouterr()
    assert remote_push.push(cache_mod.Entry(row.path, cache_mod.read_manifest(row.path)), settings.current(env),
                       Reporter(False)) is None
    assert "file:///tmp/x" in capfd.readouterr().err and list(cwd.iterdir()) == []
    remote_fs._DEAD.clear()


# -- item 5 (the store): prune --remote --older-than DAYS -------------------------------------------------


@pytest.mark.parametrize("kind", ["file", "webdav"])
def test_prune_removes_old_objects_and_never_young_ones(request, tmp_path, kind):
    if kind == "file":
        root, url = tmp_path / "store", f"file://{tmp_path / 'store'}"
    else:
        served, url, _ = request.getfixturevalue("webdav")
        root = served / "opforge"
    d = root / remote_fs.PREFIX / "remote_mod" / ("0" * 64)
    d.mkdir(parents=True)
    now = time.time()
    ages = {"0000000000000040-00000000.tar": 40, "0000000000000010-00000000.tar": 10,
            "0000000000000002-00000000.tar": 2, "0000000000000000-00000000.tar": 0.5,
            ".0123abcd.tar": 3, ".4567cdef.tar": 0.2, ".building-0000000000000002.json": 2}
    for fname, days in ages.items():
        (d / fname).write_bytes(b"x" * 100)
        os.utime(d / fname, (now - days * DAY, now - days * DAY))
    env = {"OPFORGE_REMOTE_CACHE": url}

    def prune(days, *more):
        out = cli("prune", "--remote", "--older-than", str(days), "--json", *more, env=env)
        assert out.returncode == 0, out
        got = json.loads(out.stdout)
        return {os.path.basename(f["path"]): f["action"] for f in got["files"]}, got, out.stderr

    dry, got, _ = prune(30, "--dry-run")
    assert {f for f, act in dry.items() if act == "would remove"} == {
        "0000000000000040-00000000.tar", ".0123abcd.tar", ".building-0000000000000002.json"}
    assert sorted(p.name for p in d.iterdir()) == sorted(ages) and got["dry_run"] is True
    done, got, said = prune(30)
    assert {f for f, act in done.items() if act == "removed"} == {f for f, act in dry.items() if act == "would remove"}
    assert got["summary"]["removed"] == {"count": 3, "bytes": 300} and got["summary"]["kept"]["count"] == 4
    assert "younger than 30 days (--older-than)" in said and "younger than the grace period (1 day)" in said
    everything, got, _ = prune(0)
    assert {f for f, act in everything.items() if act == "removed"} == {"0000000000000010-00000000.tar",
                                                                       "0000000000000002-00000000.tar"}
    assert sorted(p.name for p in d.iterdir()) == [".4567cdef.tar", "0000000000000000-00000000.tar"]  # the grace
    plain = cli("prune", "--remote", "--older-than", "0", env=env)
    assert plain.returncode == 0 and "removed 0 files" in plain.stdout and "kept 2" in plain.stdout, plain


def test_prune_on_s3_goes_by_the_stores_modified_time(monkeypatch, tmp_path, s3):
    import fsspec

    from opforge import settings
    from opforge.engine.progress import Reporter

    url, env = s3
    monkeypatch.setitem(fsspec.config.conf, "s3", {"endpoint_url": env["FSSPEC_S3_ENDPOINT_URL"]})
    fs, root = remote_fs._fs(url)
    for n in range(2):
        fs.pipe_file(f"{root}/{remote_fs.PREFIX}/remote_mod/k/000000000000000{n}-00000000.tar", b"x" * 10)
    s = settings.current({"OPFORGE_REMOTE_CACHE": url})
    young = remote_prune.prune(0, s, Reporter(False))
    assert [(r.action, r.why) for r in young] == [("kept", "younger than the grace period (1 day)")] * 2
    assert all(r.age_days is not None and r.age_days < 0.01 for r in young)
    later = remote_prune.prune(30, s, Reporter(False), now=time.time() + 31 * DAY)
    assert [r.action for r in later] == ["removed"] * 2 and remote.listing(s, Reporter(False)) == []
