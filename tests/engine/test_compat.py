"""opforge/compat.py: each compatibility rule, over generated facts."""

from __future__ import annotations

import dataclasses

from hypothesis import given
from hypothesis import strategies as st

from opforge import compat
from opforge.compat import TorchFacts

VERSIONS = ["2.13.0+cpu", "2.11.0+cu130", "2.10.0a0+git1234", "2.9.1", "2.14.0.dev20261120"]
facts = st.builds(TorchFacts, version=st.sampled_from(VERSIONS), git_version=st.sampled_from(["", "aaa", "bbb"]),
                  cuda=st.sampled_from([None, "12.8", "13.0"]), hip=st.sampled_from([None, "6.2"]),
                  cxx11_abi=st.booleans(), root=st.sampled_from(["/a/torch", "/b/torch"]),
                  python_tag=st.sampled_from(["cpython-311", "cpython-312"]),
                  ext_suffix=st.sampled_from([".cpython-311-x86_64-linux-gnu.so", ".so"]),
                  machine=st.sampled_from(["x86_64", "aarch64"]))
CHANGES = {"version": "2.8.0", "git_version": "zzz", "cuda": "11.8", "hip": "5.7", "machine": "riscv64",
           "python_tag": "cpython-399"}


@given(facts)
def test_facts_survive_their_json_and_a_binary_runs_on_its_own_torch(f):
    assert TorchFacts.from_json(f.to_json()) == f
    assert compat.same_torch(f, f)
    assert compat.same_torch(dataclasses.replace(f, git_version=""), dataclasses.replace(f, git_version="x"))
    assert f.abi_key(where=True) == f.as_tuple()
    assert f.abi_key() == dataclasses.replace(f, root="/elsewhere").abi_key()  # where torch is: not in the key


@given(facts, st.sampled_from(sorted(CHANGES)))
def test_another_torch_build_is_rejected_naming_what_differs(f, name):
    f = dataclasses.replace(f, git_version=f.git_version or "aaa")  # an empty git hash is unknown: not compared
    other = dataclasses.replace(f, **{name: CHANGES[name]})
    verdict = compat.same_torch(other, f)
    assert not verdict
    assert str(CHANGES[name]) in verdict.reason and "but here" in verdict.reason


@given(facts, st.sampled_from(["2.9", "2.10", "2.11", "2.13", "2.14"]))
def test_stable_abi_runs_on_its_target_and_later_whatever_the_exact_build(f, target):
    built = dataclasses.replace(f, version="2.10.0", git_version="old", root="/elsewhere", python_tag="cpython-399")
    verdict = compat.same_torch(built, f, target)
    newer = compat.version_tuple(f.version) >= compat.version_tuple(target)
    assert bool(verdict) == newer, verdict
    if not newer:
        assert f"upgrade torch to >= {target}" in verdict.reason
    # The key a stable-ABI binary is found by ignores the exact torch build too.
    assert built.abi_key(target) == f.abi_key(target)


@given(facts)
def test_a_record_with_unknown_fields_is_judged_on_what_it_recorded(f):
    partial = TorchFacts.from_json({"version": f.version, "cuda": f.cuda, "hip": f.hip, "cxx11_abi": f.cxx11_abi})
    assert partial.git_version == "" and partial.machine == "" and partial.python_tag == ""
    assert compat.same_torch(partial, f)  # unknown: not compared, never taken for this machine's
    assert TorchFacts.from_json({"cuda": "13.0"}) is None and TorchFacts.from_json("2.13") is None


@given(st.tuples(st.integers(10, 14), st.integers(0, 9)), st.sampled_from([None, "12.8", "13.0", "13.1"]))
def test_cuda_major_rejects_another_major_only(release, torch_cuda):
    verdict = compat.cuda_major(release, torch_cuda, "/opt/cuda/bin/nvcc")
    if torch_cuda is None:
        assert verdict and not verdict.reason
        return
    major, minor = (int(p) for p in torch_cuda.split("."))
    assert bool(verdict) == (release[0] == major)
    if not verdict:
        assert f"CUDA_HOME=/usr/local/cuda-{torch_cuda}" in verdict.reason
    elif release[1] != minor:
        assert "minor-version difference" in verdict.reason


def test_the_one_version_parser_reads_torch_and_tools():
    assert compat.version_tuple("2.10.0a0+git1234") == (2, 10)
    assert compat.version_numbers("Cuda compilation tools, release 12.8, V12.8.93") == (12, 8)
    assert compat.version_numbers("Build cuda_13.0.r13.0/compiler.36260728_0") == (13, 0)
    assert compat.version_numbers("clang version 17.0.6") == (17, 0, 6)
    try:
        compat.version_tuple("nightly")
    except ValueError as exc:
        assert "MAJOR.MINOR" in str(exc)
    else:
        raise AssertionError("a version without numbers must be refused")


def test_the_tf32_reader_follows_the_setting_and_falls_back_to_the_property(monkeypatch):
    import torch

    from opforge.compat import tf32_reader

    read = tf32_reader()
    before = torch.backends.cuda.matmul.allow_tf32
    try:
        for value in (True, False):
            torch.backends.cuda.matmul.allow_tf32 = value
            assert read() is value and read() == torch.backends.cuda.matmul.allow_tf32
        monkeypatch.setattr(compat, "_TF32_GETTER", "_no_such_getter")  # a torch without the private getter
        fallback = tf32_reader()
        assert fallback is not read
        for value in (True, False):
            torch.backends.cuda.matmul.allow_tf32 = value
            assert fallback() is value
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before
