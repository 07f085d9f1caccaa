"""KernelLoader: registration, pure selection for hardware we don't have, fallback with one
warning, strict mode, ext_name, prebuilt binaries (fitting and stale), and the per-process cache."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import warnings

import pytest
import torch
from conftest import ROOT, TESTS, run_python

import opforge
from opforge import isa, prebuilt
from opforge.compat import TorchFacts
from opforge.decision import Rejected
from opforge.errors import BuildError, OpforgeError
from opforge.extension import CACHED, NEEDS_BUILD, PREBUILT, READY, CppExtension, CudaExtension, Status, TorchExtension
from opforge.loader import KernelLoader
from opforge.platform import Cpu, Gpu, Platform, ToolInfo
from opforge.selection import select

AXPY = os.path.relpath(os.path.join(ROOT, "opforge", "kernels", "selftest", "csrc", "axpy.cpp"), os.path.dirname(__file__))
BROKEN = "data/broken_op.cpp"
COMMON = os.path.relpath(os.path.join(ROOT, "opforge", "kernels", "common", "csrc"), os.path.dirname(__file__))
_ids = itertools.count()

GCC = ToolInfo("/usr/bin/g++", "g++ 12.2.0")
NINJA = ToolInfo("/usr/bin/ninja", "1.11")
ICELAKE = Platform(cpu=Cpu(microarch="icelake", features=frozenset(isa.AVX512.features)), cxx=GCC, ninja=NINJA)
HASWELL = Platform(cpu=Cpu(microarch="haswell", features=frozenset(isa.AVX2.features)), cxx=GCC, ninja=NINJA)
GRAVITON = Platform(machine="aarch64", cpu=Cpu(family="aarch64", microarch="neoverse_v1", features=frozenset({"asimd"})),
                    cxx=GCC, ninja=NINJA)
NO_COMPILER = Platform(cpu=ICELAKE.cpu, ninja=NINJA)


def toy_kind():
    """A fresh example kernel kind (unique names: a loaded op namespace can't be loaded twice)."""
    n = next(_ids)
    kind = f"toy{n}"

    class Loader(KernelLoader):
        pass

    Loader.kind = kind  # set after class creation: toy loaders stay out of the global kind registry

    class Cpp(CppExtension):
        name, priority, sources, stable_abi = f"toy{n}_cpp", 20, (AXPY,), "2.10"
        include_dirs = (COMMON,)

    class Torch(TorchExtension):
        name, priority, module = f"toy{n}_torch", 0, "toy_reference"

    class Never(TorchExtension):
        name, priority, module = f"toy{n}_never", 99, "toy_reference"

        def is_available(self, platform):
            return Rejected("never available (the tests' always-reject variant)")

    class Broken(CppExtension):
        name, priority, sources = f"toy{n}_broken", 50, (BROKEN,)

    for cls in (Cpp, Torch, Never, Broken):
        cls.kind = kind
        Loader.register_extension(cls)
    return Loader, Cpp, Torch, Never, Broken


def names(cands):
    return [(c.name, bool(c.decision), c.chosen) for c in cands]


# -- selection: pure, for hardware we don't have ------------------------------------------


def selftest_exts():
    from opforge.kernel_loader import SelftestLoader

    return SelftestLoader.extensions()


def chosen(platform, statuses=None):
    exts = selftest_exts()
    statuses = statuses or {e.name: Status(READY if e.backend == "torch" else NEEDS_BUILD) for e in exts}
    (c,) = [c for c in select(exts, platform, statuses) if c.chosen]
    return c.name


def test_selection_picks_the_best_isa_for_each_cpu():
    assert chosen(ICELAKE) == "selftest_avx512"
    assert chosen(HASWELL) == "selftest_avx2"
    assert chosen(GRAVITON) == "selftest_neon"
    assert chosen(Platform(cpu=Cpu(features=frozenset({"sse2"})), cxx=GCC, ninja=NINJA)) == "selftest_scalar"


def test_selection_explains_each_rejection():
    cands = {c.name: c for c in select(selftest_exts(), HASWELL, {})}
    assert not cands["selftest_avx512"].available
    assert "lacks avx512f, avx512bw, avx512vl" in cands["selftest_avx512"].decision.reason
    assert "aarch64" in cands["selftest_neon"].decision.reason
    assert cands["selftest_avx512"].status is None  # never looked up


def test_no_compiler_falls_to_prebuilt_cached_or_torch():
    assert chosen(NO_COMPILER) == "selftest_torch"
    cands = {c.name: c for c in select(selftest_exts(), NO_COMPILER, {})}
    assert cands["selftest_avx512"].available and not cands["selftest_avx512"].compatible
    assert "no C++ compiler" in cands["selftest_avx512"].decision.reason
    assert "OPFORGE_BUILD=selftest" in cands["selftest_avx512"].decision.reason
    # A prebuilt or cached binary needs no compiler.
    assert chosen(NO_COMPILER, {"selftest_avx512": Status(PREBUILT)}) == "selftest_avx512"
    assert chosen(NO_COMPILER, {"selftest_avx2": Status(CACHED), "selftest_avx512": Status(NEEDS_BUILD)}) == "selftest_avx2"


def test_stable_abi_extension_rejected_on_an_older_torch():
    old = Platform(cpu=ICELAKE.cpu, cxx=GCC, ninja=NINJA, torch=TorchFacts("2.8.0+cpu"))
    cands = {c.name: c for c in select(selftest_exts(), old, {})}
    assert "stable ABI of torch 2.10" in cands["selftest_avx512"].decision.reason
    assert chosen(old) == "selftest_torch"


class _Sm90(CudaExtension):
    name, kind, sources, min_capability = "cuda_sm90_example", "example", (AXPY,), (9, 0)


class _AnyCuda(CudaExtension):
    name, kind, sources = "cuda_any_example", "example", (AXPY,)


def test_cuda_extensions_by_gpu_and_toolkit():
    nvcc13 = ToolInfo("/usr/local/cuda/bin/nvcc", "Build cuda_13.0.r13.0/compiler.36424714_0")
    a100 = Platform(gpus=(Gpu(0, "A100", "nvidia", (8, 0), "sm_80"),), torch=TorchFacts(cuda="13.0"), nvcc=nvcc13, cxx=GCC, ninja=NINJA)
    assert "compute capability >= 9.0; the GPUs here are 8.0" in _Sm90().is_available(a100).reason
    assert _AnyCuda().is_available(a100)
    assert _AnyCuda().check_compatible(a100)
    mismatch = Platform(gpus=a100.gpus, torch=TorchFacts(cuda="12.8"), nvcc=nvcc13, cxx=GCC, ninja=NINJA)
    reason = _AnyCuda().check_compatible(mismatch).reason
    assert "nvcc is CUDA 13.0, but torch was built with CUDA 12.8" in reason and "CUDA_HOME" in reason
    assert "none found" in _AnyCuda().is_available(Platform()).reason
    assert "without CUDA" in _AnyCuda().check_compatible(Platform(gpus=a100.gpus)).reason
    (c,) = select([_AnyCuda()], Platform(gpus=a100.gpus, torch=TorchFacts(cuda="13.0"), cxx=GCC, ninja=NINJA), {})
    assert "nvcc not found" in c.decision.reason


# -- registration --------------------------------------------------------------------------


def test_selection_per_tensor_device():
    """A GPU machine: CUDA tensors get the CUDA variant, CPU tensors the best CPU one, any other
    device the torch one; each rejection says which tensors the variant takes."""
    nvcc13 = ToolInfo("/usr/local/cuda/bin/nvcc", "Build cuda_13.0.r13.0/compiler.36424714_0")
    gpu = Platform(cpu=ICELAKE.cpu, gpus=(Gpu(0, "H100", "nvidia", (9, 0), "sm_90"),), torch=TorchFacts(cuda="13.0"), nvcc=nvcc13,
                   cxx=GCC, ninja=NINJA)
    cuda = _AnyCuda()
    cuda.priority = 60  # above the CPU variants, as a real CUDA variant is
    exts = [cuda, *selftest_exts()]

    def pick(device):
        return next(c.name for c in select(exts, gpu, {}, device) if c.chosen)

    assert pick(None) == pick("cuda") == "cuda_any_example"
    assert pick("cpu") == "selftest_avx512"
    assert pick("mps") == "selftest_torch"
    cands = {c.name: c for c in select(exts, gpu, {}, "cpu")}
    assert cands["cuda_any_example"].decision.reason == "takes cuda tensors, not cpu"
    assert cands["selftest_avx512"].chosen and cands["selftest_torch"].decision


def test_register_rejects_non_extensions_duplicates_and_wrong_kind():
    Loader, Cpp, *_ = toy_kind()
    with pytest.raises(TypeError, match="takes a subclass of opforge.Extension"):
        Loader.register_extension(object)
    with pytest.raises(TypeError, match="takes a subclass of opforge.Extension"):
        Loader.register_extension(Cpp())

    class Dup(TorchExtension):
        name, kind, module = Cpp.name, Loader.kind, "toy_reference"

    with pytest.raises(ValueError, match=f"{Cpp.name!r} is already registered"):
        Loader.register_extension(Dup)

    class Other(TorchExtension):
        name, kind, module = "toy_other_kind", "something_else", "toy_reference"

    with pytest.raises(TypeError, match="is of kind 'something_else'"):
        Loader.register_extension(Other)

    class BadName(TorchExtension):
        name, module = "bad-name", "toy_reference"

    with pytest.raises(TypeError, match="not a valid identifier"):
        Loader.register_extension(BadName)

    class NoSource(CppExtension):
        name, sources = "toy_missing_source", ("nope.cpp",)

    with pytest.raises(TypeError, match="nope.cpp does not exist"):
        Loader.register_extension(NoSource)


def test_register_works_as_a_decorator():
    Loader, *_ = toy_kind()

    @Loader.register_extension
    class Extra(TorchExtension):
        name, module = f"{Loader.kind}_extra", "toy_reference"

    assert Extra.kind == Loader.kind and Extra in Loader._extensions


def test_unknown_ext_name_lists_the_valid_names():
    Loader, Cpp, Torch, Never, Broken = toy_kind()
    with pytest.raises(ValueError) as err:
        Loader().load(ext_name="nope")
    for n in (Cpp.name, Torch.name, Never.name, Broken.name):
        assert n in str(err.value)


def test_explicit_ext_name_that_is_rejected_says_why():
    Loader, _, _, Never, _ = toy_kind()
    with pytest.raises(OpforgeError, match="never available"):
        Loader().load(ext_name=Never.name)


def test_nothing_loadable_lists_each_implementation_and_why():
    """No fallback left (no torch variant): one OpforgeError, a line per implementation."""
    n = next(_ids)

    class Loader(KernelLoader):
        pass

    Loader.kind = f"toy{n}"

    class Never(TorchExtension):
        name, kind, priority, module = f"toy{n}_never", Loader.kind, 9, "toy_reference"

        def is_available(self, platform):
            return Rejected("never available (the tests' always-reject variant)")

    class Gone(TorchExtension):
        name, kind, priority, module = f"toy{n}_gone", Loader.kind, 5, "opforge_test_no_such_module"

    Loader.register_extension(Never)
    Loader.register_extension(Gone)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(OpforgeError, match=f"no toy{n} implementation can be loaded here") as err:
            Loader().load()
    msg = str(err.value)
    assert f"{Gone.name}: ModuleNotFoundError: No module named 'opforge_test_no_such_module'" in msg
    assert f"{Never.name}: never available" in msg
    fallbacks = [str(w.message) for w in caught if issubclass(w.category, opforge.KernelFallbackWarning)]
    assert len(fallbacks) == 1 and Gone.name in fallbacks[0], fallbacks  # Gone's failure, before giving up


# -- loading, fallback, strict ---------------------------------------------------------------


def test_failed_build_falls_back_with_one_warning(cache_dir):
    Loader, Cpp, _, _, Broken = toy_kind()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        k = Loader().load()
        again = Loader().load()
    assert again is k  # cached per process
    fallbacks = [w for w in caught if issubclass(w.category, opforge.KernelFallbackWarning)]
    assert len(fallbacks) == 1, [str(w.message) for w in caught]
    msg = str(fallbacks[0].message)
    assert Broken.name in msg and "BuildError" in msg and "falling back" in msg
    assert "this_symbol_does_not_exist" in msg  # the compiler's first error, not just "First errors:"
    assert k.name == Cpp.name and k.origin == "built" and k.simd_width() == 1
    x, y = torch.randn(19), torch.randn(19)
    torch.testing.assert_close(k.axpy(x, y, 0.5), 0.5 * x + y)


def test_strict_raises_the_build_error_with_its_excerpt(cache_dir):
    Loader, *_ = toy_kind()
    with pytest.raises(BuildError) as err:
        Loader().load(strict=True)
    assert "this_symbol_does_not_exist" in str(err.value) + err.value.excerpt


def test_torch_variant_when_nothing_else_works(cache_dir, monkeypatch):
    Loader, Cpp, Torch, *_ = toy_kind()
    monkeypatch.setenv("CXX", "/nonexistent/c++")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # rejected up front: no build attempt, one notice that says so
        k = Loader().load()
    assert (k.name, k.origin, k.backend) == (Torch.name, "python", "torch")
    (notice,) = [str(w.message) for w in caught]
    assert notice.startswith(f"{Loader.kind}: using {Torch.name} (torch backend)") and "no C++ compiler" in notice
    rejected = {c.name: c.decision.reason for c in Loader().candidates() if not c.decision}
    assert "no C++ compiler" in rejected[Cpp.name]


def test_concurrent_loads_in_threads_get_one_result(cache_dir):
    from concurrent.futures import ThreadPoolExecutor

    Loader, *_ = toy_kind()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with ThreadPoolExecutor(4) as pool:
            results = list(pool.map(lambda _: Loader().load(), range(8)))
    assert all(r is results[0] for r in results)


# -- prebuilt binaries ------------------------------------------------------------------------


def fake_prebuilt(tmp_path, ext, binary, **info):
    d = tmp_path / "_C"
    d.mkdir()
    shutil.copy(binary, d / f"{ext.name}.abi3.so")
    record = {"format": prebuilt.FORMAT, "torch": torch.__version__, "torch_git": torch.version.git_version,
              "cuda": torch.version.cuda, "hip": None, "cxx11_abi": torch.compiled_with_cxx11_abi(),
              "machine": os.uname().machine,
              "extensions": {ext.name: {"file": f"{ext.name}.abi3.so", "kind": ext.kind, "backend": "cpp",
                                        "stable_abi": ext.stable_abi, "sha256": ""}}}
    record.update(info)
    (d / "build_info.json").write_text(json.dumps(record))
    return d


def test_prebuilt_for_another_torch_is_skipped_with_a_warning_then_jit(cache_dir, tmp_path, monkeypatch):
    Loader, Cpp, *_ = toy_kind()
    Cpp.stable_abi = None  # a torch-C++-API binary: it needs the exact torch it was built for
    bogus = tmp_path / "bogus.so"
    bogus.write_bytes(b"not loaded")
    monkeypatch.setattr(prebuilt, "DIRECTORY", str(fake_prebuilt(tmp_path, Cpp, bogus, torch="2.12.0+cpu")))
    Cpp.stable_abi = "2.10"
    cands = {c.name: c for c in Loader().candidates()}
    assert cands[Cpp.name].status.state == NEEDS_BUILD
    assert "prebuilt for torch 2.12.0+cpu, but here torch is" in cands[Cpp.name].status.note
    with pytest.warns(opforge.KernelFallbackWarning, match="prebuilt binary skipped: prebuilt for torch 2.12.0"):
        k = Loader().load(ext_name=Cpp.name)
    assert k.origin == "built"


def test_prebuilt_binary_loads_with_no_compiler(cache_dir, tmp_path):
    _, Cpp, *_ = toy_kind()
    binary = Cpp().build_jit().binary  # a real binary for this torch, taken from the JIT cache
    d = fake_prebuilt(tmp_path, Cpp, binary)
    empty_cache = tmp_path / "empty-cache"
    code = f"""
import os, torch, opforge
from opforge import prebuilt
prebuilt.DIRECTORY = {str(d)!r}
from test_loader import toy_kind, _ids
import itertools
for _ in range({int(Cpp.name[3:-4])}): next(_ids)
Loader, Cpp, *_ = toy_kind()
import warnings
warnings.simplefilter("error", opforge.KernelFallbackWarning)  # a fitting prebuilt binary loads silently
k = Loader().load(ext_name=Cpp.name)
x, y = torch.ones(5), torch.ones(5)
built = [n for n in os.listdir({str(empty_cache)!r}) if not n.startswith(".")] if os.path.exists({str(empty_cache)!r}) else []
print(k.origin, k.axpy(x, y, 2.0).tolist(), built)
"""
    out = run_python(code, env={"CXX": "/nonexistent/c++", "PATH": "/nonexistent",
                                "OPFORGE_CACHE_DIR": str(empty_cache), "PYTHONPATH": f"{ROOT}:{TESTS}:{os.path.dirname(__file__)}"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[0] == "prebuilt [3.0, 3.0, 3.0, 3.0, 3.0] []"  # nothing built, nothing cached


def test_tampered_prebuilt_binary_is_not_loaded(cache_dir, tmp_path):
    Loader, Cpp, *_ = toy_kind()
    bogus = tmp_path / "bogus.so"
    bogus.write_bytes(b"\x7fELF tampered")
    d = fake_prebuilt(tmp_path, Cpp, bogus)
    record = json.loads((d / "build_info.json").read_text())
    record["extensions"][Cpp.name]["sha256"] = "0" * 64
    (d / "build_info.json").write_text(json.dumps(record))
    pb = prebuilt.read(str(d))
    with pytest.raises(OpforgeError, match="does not match the sha256"):
        pb.verify(Cpp.name)
    import unittest.mock

    with unittest.mock.patch.object(prebuilt, "DIRECTORY", str(d)):
        assert {c.name: c for c in Loader().candidates()}[Cpp.name].status.state == PREBUILT  # checked by version; the hash at load
        with pytest.warns(opforge.KernelFallbackWarning, match="does not match the sha256"):
            k = Loader().load(ext_name=Cpp.name)
    assert k.origin == "built"


@pytest.mark.cuda
def test_cuda_variant_is_chosen_on_a_gpu_and_matches_torch(cache_dir):
    n = next(_ids)

    class Loader(KernelLoader):
        pass

    Loader.kind = f"toycuda{n}"

    class Cuda(CudaExtension):
        name, kind, priority, sources = f"toycuda{n}_cuda", Loader.kind, 60, ("data/axpy_cuda.cu",)

    class Torch(TorchExtension):
        name, kind, priority, module = f"toycuda{n}_torch", Loader.kind, 0, "toy_reference"

    Loader.register_extension(Cuda)
    Loader.register_extension(Torch)
    (first, _) = Loader().candidates()
    assert first.chosen and first.available.reason.startswith("sm_"), first
    with warnings.catch_warnings():
        warnings.simplefilter("error", opforge.KernelFallbackWarning)
        k = Loader().load()
    assert (k.name, k.backend, k.origin, k.simd_width()) == (Cuda.name, "cuda", "built", 32)
    x, y = torch.randn(100_003, device="cuda"), torch.randn(100_003, device="cuda")
    torch.testing.assert_close(k.axpy(x, y, -2.0), -2.0 * x + y)
    with pytest.raises(RuntimeError, match="must be float32"):
        k.axpy(x.double(), y.double(), 1.0)
    with pytest.raises(RuntimeError, match="Could not run .* from the 'CPU' backend"):  # the dispatcher says so
        k.axpy(x.cpu(), y.cpu(), 1.0)


def test_cuda_sources_get_the_op_namespace_too():
    flags = _AnyCuda().cuda_compile_flags()
    assert "-DOPFORGE_NS=cuda_any_example" in flags and "-O3" in flags


def test_register_cpu_variants_declares_one_extension_per_isa():
    Loader, *_ = toy_kind()

    class Base(CppExtension):
        sources, stable_abi = (AXPY,), "2.10"

    made = Loader.register_cpu_variants(Base, f"{Loader.kind}_v")
    assert [(c.name, c.isa.name, c.priority) for c in made] == [
        (f"{Loader.kind}_v_avx512", "avx512", 40), (f"{Loader.kind}_v_avx2", "avx2", 30),
        (f"{Loader.kind}_v_neon", "neon", 30), (f"{Loader.kind}_v_scalar", "portable", 10)]
    assert all(c.kind == Loader.kind and c.source_paths() == Base.source_paths() for c in made)
    assert chosen(HASWELL) == "selftest_avx2"  # the shipped kinds are declared this way


def test_a_first_load_hashes_the_sources_and_scans_the_cache_once(shared_cache):
    """The status a loader works out (the spec, the cache entry found) goes on to the load, so a
    first load in a process makes one spec and one cache lookup, not two of each (issue 22)."""
    from conftest import in_cache

    from opforge.kernel_loader import SelftestLoader

    in_cache(shared_cache, lambda: SelftestLoader().load())  # built (or found) here: warm for the child
    code = """
from opforge import extension
from opforge.engine import jit
from opforge.kernel_loader import SelftestLoader
counts = {"spec": 0, "find": 0}
spec, find = extension.CompiledExtension.spec, jit.find_entry
def counted_spec(self, s):
    counts["spec"] += 1
    return spec(self, s)
def counted_find(*args, **kw):
    counts["find"] += 1
    return find(*args, **kw)
extension.CompiledExtension.spec, jit.find_entry = counted_spec, counted_find
k = SelftestLoader().load()
print(k.origin, counts["spec"], counts["find"])
"""
    out = run_python(code, env={"OPFORGE_CACHE_DIR": str(shared_cache)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [CACHED, "1", "1"], out.stdout
