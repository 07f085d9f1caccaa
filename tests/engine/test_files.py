"""``opforge.files``: the one whole-or-nothing write."""

from __future__ import annotations

import os

import pytest

from opforge.files import atomic_write, write_if_changed


def test_a_write_replaces_the_file_whole_and_leaves_no_temp_file(tmp_path):
    path = tmp_path / "state.json"
    atomic_write(str(path), b"old")
    atomic_write(str(path), "névé")  # text: UTF-8
    assert path.read_bytes() == "névé".encode() and os.listdir(tmp_path) == ["state.json"]
    atomic_write(str(path), b"", durable=False)
    assert path.read_bytes() == b""


def test_a_failed_write_leaves_the_old_file_and_no_temp_file(tmp_path):
    target = tmp_path / "taken"
    target.mkdir()  # the final name is a non-empty directory: the rename fails
    (target / "keep").write_text("x")
    with pytest.raises(OSError):
        atomic_write(str(target), b"new")
    assert sorted(os.listdir(tmp_path)) == ["taken"] and (target / "keep").read_text() == "x"
    with pytest.raises(OSError):
        atomic_write(str(tmp_path / "missing" / "f"), b"new")  # no such directory: nothing is left


def test_write_if_changed_keeps_the_mtime_of_the_same_text(tmp_path):
    path = tmp_path / "build.ninja"
    assert write_if_changed(str(path), "rule cc\n")
    os.utime(path, ns=(1, 1))
    assert not write_if_changed(str(path), "rule cc\n")
    assert os.stat(path).st_mtime_ns == 1
    assert write_if_changed(str(path), "rule cxx\n") and path.read_text() == "rule cxx\n"
    path.write_bytes(b"\xff\xfe")  # not UTF-8: rewritten, not an error
    assert write_if_changed(str(path), "rule cc\n")
