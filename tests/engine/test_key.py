"""The build key, settings, dependency records and flag derivation, without building."""

from __future__ import annotations

import dataclasses
import json
import os
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from opforge import settings
from opforge.engine import deps, flags, key


@pytest.fixture
def spec_of(tmp_path):
    src = tmp_path / "k.cpp"
    src.write_text("int f() { return 1; }\n")

    def make(env=None, name="kmod", cflags=None, sources=None, **kw):
        s = settings.current({"PATH": os.environ["PATH"], **(env or {})})
        return key.make_spec(s, name, sources or [str(src)], cflags, None, None, None, None, True, False, **kw)

    return make, src


def test_every_input_moves_the_key(spec_of):
    make, src = spec_of
    base = make()
    assert make().input_key == base.input_key  # deterministic
    assert make(cflags=["-O2"]).input_key != base.input_key
    assert make(name="kmod2").input_key != base.input_key
    assert make(env={"TORCH_CUDA_ARCH_LIST": "9.0"}).input_key != base.input_key
    assert make(env={"CXX": "g++"}).input_key != base.input_key
    src.write_text("int f() { return 2; }\n")
    edited = make()
    assert edited.input_key != base.input_key
    assert edited.config_key == base.config_key  # same build dir: incremental rebuild


def test_torch_and_python_are_in_the_key(spec_of):
    make, _ = spec_of
    base = make()
    other = dataclasses.replace(base, torch=dataclasses.replace(base.torch, version="9.9.9"))
    assert other.input_key != base.input_key
    other = dataclasses.replace(base, torch=dataclasses.replace(base.torch, python_tag="cpython-399"))
    assert other.input_key != base.input_key
    other = dataclasses.replace(base, torch=dataclasses.replace(base.torch, cxx11_abi=not base.torch.cxx11_abi))
    assert other.input_key != base.input_key


def test_native_flags_pull_in_the_host_cpu(spec_of):
    make, _ = spec_of
    assert make().cpu_identity == ""
    assert make(cflags=["-march=native"]).cpu_identity != ""


def test_portable_key_ignores_the_toolchain_only(spec_of):
    make, _ = spec_of
    base = make()
    assert make(env={"CXX": "g++"}).portable_key == base.portable_key
    assert make(cflags=["-O2"]).portable_key != base.portable_key


@given(st.text(max_size=12))
def test_check_name_accepts_exactly_identifiers(name):
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        assert key.check_name(name) == name
    else:
        with pytest.raises(ValueError, match="not a valid identifier") as info:
            key.check_name(name)
        suggestion = re.search(r"\(e\.g\. '(.*)'\)$", str(info.value))
        assert suggestion and re.fullmatch(r"[A-Za-z_]\w*", suggestion.group(1), re.ASCII)


def test_dep_records_hash_only_when_the_stat_moved(tmp_path):
    f = tmp_path / "h.h"
    f.write_text("#define X 1\n")
    rec = deps.DepRecord.of(str(f))
    assert deps.check([rec]) == []
    os.utime(f, ns=(rec.mtime_ns + 10**9, rec.mtime_ns + 10**9))  # touched, same bytes
    assert deps.check([rec]) == []
    f.write_text("#define X 2\n")  # same size, new bytes
    assert deps.check([rec]) == [str(f)]
    f.unlink()
    assert deps.check([rec]) == [str(f)]


def test_headers_digest_ignores_sources_and_order():
    a = deps.DepRecord("/s/a.cpp", 1, 1, "aa")
    h1 = deps.DepRecord("/s/h1.h", 1, 1, "11")
    h2 = deps.DepRecord("/s/h2.h", 1, 1, "22")
    assert deps.headers_digest([a, h1, h2], ["/s/a.cpp"]) == deps.headers_digest([h2, h1], [])
    assert deps.headers_digest([h1], []) != deps.headers_digest([h2], [])


def test_settings_parse_and_reject():
    s = settings.current({"MAX_JOBS": "four", "OPFORGE_VERBOSE": "yes"})
    assert s.max_jobs is None and s.verbose
    assert settings.current({"HOME": "/h"}).cache_dir == "/h/.cache/opforge"
    assert settings.current({"XDG_CACHE_HOME": "/x"}).cache_dir == "/x/opforge"
    with pytest.raises(ValueError, match="OPFORGE_LOCK_TIMEOUT"):
        settings.current({"OPFORGE_LOCK_TIMEOUT": "soon"})
    with pytest.raises(ValueError, match="OPFORGE_LOCK_TIMEOUT"):
        settings.current({"OPFORGE_LOCK_TIMEOUT": "-1"})


@pytest.mark.parametrize("archs", ["8.0", "8.0;9.0+PTX", "7.5 8.6", "9.0a", "8.6+PTX;9.0", "Hopper", "Ampere;Ada"])
def test_fallback_arch_flags_agree_with_torch(archs, monkeypatch):
    """torch's _get_cuda_arch_flags is private: the fallback must give the same flags."""
    from torch.utils import cpp_extension

    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", archs)
    assert flags.fallback_cuda_arch_flags(archs, []) == cpp_extension._get_cuda_arch_flags([])


def test_fallback_arch_flags_from_visible_gpus():
    assert flags.fallback_cuda_arch_flags(None, [(9, 0), (8, 0), (9, 0)]) == [
        "-gencode=arch=compute_80,code=sm_80",
        "-gencode=arch=compute_90,code=compute_90",
        "-gencode=arch=compute_90,code=sm_90",
    ]
    with pytest.raises(ValueError, match="TORCH_CUDA_ARCH_LIST"):
        flags.fallback_cuda_arch_flags(None, [])


def test_arch_flags_fall_back_when_torch_lacks_the_private_helper(monkeypatch):
    from torch.utils import cpp_extension

    monkeypatch.delattr(cpp_extension, "_get_cuda_arch_flags")
    s = settings.current({"TORCH_CUDA_ARCH_LIST": "9.0"})
    assert flags.cuda_arch_flags((), s) == ["-gencode=arch=compute_90,code=sm_90"]
    assert flags.cuda_arch_flags(("-arch=sm_80",), s) == []


@pytest.mark.parametrize("archs, built", [
    ("8.0;9.0+PTX", ["-gencode=arch=compute_80,code=sm_80", "-gencode=arch=compute_90,code=compute_90",
                     "-gencode=arch=compute_90a,code=sm_90a"]),
    ("9.0a", ["-gencode=arch=compute_90a,code=sm_90a"]),
    ("8.0+PTX", ["-gencode=arch=compute_80,code=compute_80", "-gencode=arch=compute_80,code=sm_80"]),
])
def test_an_arch_specific_build_makes_sm_90_code_sm_90a(archs, built, spec_of, monkeypatch):
    """``flags.ARCH_SPECIFIC`` in an extension's nvcc flags: its sm_90 SASS is sm_90a (the 64-token wgmma tile of
    block_sparse's decode kernel), PTX stays compute_90, other archs as they were; without it, nothing moves."""
    make, _ = spec_of
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", archs)
    monkeypatch.setattr(flags, "_ask_torch", lambda device, version: {"include": [], "lib": ["/t"], "std": "-std=c++17"})
    env = {"TORCH_CUDA_ARCH_LIST": archs}
    s = settings.current({"PATH": os.environ["PATH"], **env})
    base = make(env=env)
    plain = flags.derive(dataclasses.replace(base, with_cuda=True), s)
    special = flags.derive(dataclasses.replace(base, with_cuda=True, extra_cuda_cflags=(flags.ARCH_SPECIFIC,)), s)
    gencode = sorted(f for f in special.cuda_cflags if f.startswith("-gencode"))
    assert gencode == built
    assert sorted(f for f in plain.cuda_cflags if f.startswith("-gencode")) == sorted(
        f.replace("compute_90a,code=sm_90a", "compute_90,code=sm_90") if archs != "9.0a" else f for f in built)
    assert flags.ARCH_SPECIFIC in special.cuda_cflags


def test_derived_flags_follow_torch(spec_of):
    make, _ = spec_of
    spec = make(cflags=["-O3"])
    s = settings.current({"PATH": os.environ["PATH"]})
    f = flags.derive(spec, s)
    assert "-DTORCH_EXTENSION_NAME=kmod" in f.cflags and f.cflags[-1] == "-O3"
    assert "-fPIC" in f.cflags and "-shared" in f.ldflags and "-ltorch_python" in f.ldflags
    assert "-isystem" in f.cflags
    standalone = flags.derive(dataclasses.replace(spec, is_standalone=True, is_python_module=False), s)
    assert "-shared" not in standalone.ldflags and "-ltorch_python" not in standalone.ldflags
    assert not any("TORCH_EXTENSION_NAME" in x for x in standalone.cflags)


def test_cxx_std_is_torchs_own(monkeypatch):
    from torch.utils import cpp_extension

    src = open(cpp_extension.__file__).read()
    assert flags.torch_cxx_std("0.0") in src
    monkeypatch.delattr(cpp_extension, "_write_ninja_file_to_build_library")  # private: fall back on the version
    assert flags.torch_cxx_std("2.13.0") == "-std=c++20"
    assert flags.torch_cxx_std("2.11.0") == "-std=c++17"


def test_stable_abi_key_survives_a_torch_upgrade_and_names_its_target():
    from dataclasses import replace

    from opforge.compat import TorchFacts
    from opforge.engine.key import BuildSpec

    t211 = TorchFacts("2.11.0+cu130", "aaa", "13.0", None, True, "/venv/torch", "cpython-312", ".so", "x86_64")
    t213 = replace(t211, version="2.13.0+cu130", git_version="bbb")
    args = ("ext", ("/s/a.cpp",), ("d" * 64,), (), (), (), (), False, False, False, None, None)
    stable_old = BuildSpec(*args, t211, (), stable_abi="2.10")
    stable_new = BuildSpec(*args, t213, (), stable_abi="2.10")
    assert stable_old.input_key == stable_new.input_key
    assert stable_old.torch_key() == ("stable-abi", "2.10", "13.0", None, True, "x86_64")
    assert stable_old.describe()["stable_abi"] == "2.10"  # the manifest says what the key was
    # A CUDA major change, or another stable target, is another binary.
    assert BuildSpec(*args, replace(t213, cuda="12.8"), (), stable_abi="2.10").input_key != stable_new.input_key
    assert BuildSpec(*args, t213, (), stable_abi="2.11").input_key != stable_new.input_key
    # Torch's C++ API binaries are keyed on the exact torch.
    assert BuildSpec(*args, t211, ()).input_key != BuildSpec(*args, t213, ()).input_key


def test_stable_abi_build_needs_a_library_and_a_recent_torch(cache_dir, tmp_path):
    from opforge import settings
    from opforge.engine import key
    from opforge.errors import ToolchainError

    src = tmp_path / "a.cpp"
    src.write_text("int f() { return 1; }\n")
    with pytest.raises(ValueError, match="is_python_module=False"):
        key.make_spec(settings.current(), "st", [str(src)], None, None, None, None, False, True, False, "2.10")
    with pytest.raises(ToolchainError, match="upgrade torch to >= 9.0"):
        key.make_spec(settings.current(), "st", [str(src)], None, None, None, None, False, False, False, "9.0")


def test_a_compiler_with_only_a_static_libstdcxx_gets_the_shared_one(tmp_path):
    """A relocated GCC without libstdc++.so links a private C++ runtime into each kernel, and
    a kernel's failed input check then crashes the process (seen on the GPU host's
    /opt/gcc). opforge links the system's libstdc++.so.6 explicitly for such compilers."""
    from opforge.engine import toolchain

    def fake(name, answer):
        path = tmp_path / name
        path.write_text(f"#!/bin/sh\ncase \"$1\" in -print-file-name=*) echo '{answer}';; esac\n")
        path.chmod(0o755)
        st = path.stat()
        return toolchain.Tool((str(path),), str(path), st.st_size, st.st_mtime_ns)

    static = fake("g++-relocated", "libstdc++.so")
    normal = fake("g++-normal", "/usr/lib/gcc/x86_64-linux-gnu/12/libstdc++.so")
    assert toolchain.static_libstdcxx(static) and not toolchain.static_libstdcxx(normal)
    assert flags.runtime_ldflags(static) == ["-l:libstdc++.so.6"]
    assert flags.runtime_ldflags(normal) == [] and flags.runtime_ldflags(None) == []


def test_the_linker_is_the_fastest_that_links_here(tmp_path):
    """OPFORGE_LINKER=auto tries mold, lld, then gold with a real link, each only when its
    ld.NAME is on PATH, and keeps the compiler's default when none links; a linker in the
    user's flags always wins."""
    from opforge.engine import toolchain

    def fake(name, links):
        path = tmp_path / name
        cases = "".join(f"  -fuse-ld={ld}) exit 0;;\n" for ld in links)
        path.write_text(f"#!/bin/sh\nfor a in \"$@\"; do case \"$a\" in\n{cases}  -fuse-ld=*) exit 1;;\n"
                        "esac; done\nexit 0\n")
        path.chmod(0o755)
        st = path.stat()
        return toolchain.Tool((str(path),), str(path), st.st_size, st.st_mtime_ns)

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for ld in ("ld.gold", "ld.lld"):
        (bin_dir / ld).write_text("#!/bin/sh\n")
        (bin_dir / ld).chmod(0o755)
    path = str(bin_dir)
    gold_only, none = fake("cxx-gold", ["gold"]), fake("cxx-none", [])
    assert toolchain.linker_flags(gold_only, "auto", (), path) == ["-fuse-ld=gold"]
    assert toolchain.linker_flags(fake("cxx-all", ["gold", "lld", "mold"]), "auto", (), path) == ["-fuse-ld=lld"]
    assert toolchain.linker_flags(gold_only, "auto", (), str(tmp_path / "empty")) == []  # no ld.gold on PATH
    assert toolchain.linker_flags(none, "auto", (), path) == []
    assert toolchain.linker_flags(none, "bfd", (), path) == ["-fuse-ld=bfd"]  # asked for: the build says if it fails
    assert toolchain.linker_flags(gold_only, "default", (), path) == []
    assert toolchain.linker_flags(None, "auto", (), path) == []
    assert toolchain.linker_flags(gold_only, "auto", ("-fuse-ld=lld",), path) == []
    assert settings.current({"OPFORGE_LINKER": " Gold "}).linker == "gold"
    assert settings.current({}).linker == "auto"
    with pytest.raises(ValueError, match="OPFORGE_LINKER='ldd' is not a linker opforge knows; use auto"):
        settings.current({"OPFORGE_LINKER": "ldd"})


def test_ninja_runs_one_job_per_usable_cpu_unless_max_jobs(monkeypatch):
    from opforge.engine import compile as compile_mod

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 3, 5}, raising=False)
    assert compile_mod.default_jobs() == 3
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: None)
    assert compile_mod.default_jobs() == 1


def test_the_python_include_dir_is_sysconfigs():
    import sysconfig

    assert key.python_include() == sysconfig.get_path("include", scheme="posix_prefix")


def test_the_key_holds_no_path_of_this_machine(spec_of, tmp_path):
    """The same bytes at two paths, include dirs and flags naming them: one key (relocate.py)."""
    make, src = spec_of
    keys = set()
    for where in ("ci/builds/p", "home/u/venvs/x/p"):
        base = tmp_path / where
        (base / "include").mkdir(parents=True)
        (base / "csrc").mkdir()
        (base / "csrc" / "k.cpp").write_text(src.read_text())
        s = settings.current({"PATH": os.environ["PATH"]})
        spec = key.make_spec(s, "kmod", [str(base / "csrc" / "k.cpp")], [f"-DDATA={base}/data"], None, None,
                             [str(base / "include")], None, True, False)
        assert (spec.root, spec.key_sources) == (str(base), ("csrc/k.cpp",))
        keys.add((spec.input_key, spec.config_key, spec.portable_key))
        assert str(tmp_path) not in json.dumps(spec._config(), default=str)
    assert len(keys) == 1
    moved = make(sources=[str(tmp_path / "ci/builds/p/csrc/k.cpp")], source_root=str(tmp_path / "ci"))
    assert moved.key_sources == ("builds/p/csrc/k.cpp",)  # a declared root: the layout under it is in the key
