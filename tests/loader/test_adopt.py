"""Classes written the ColossalAI way (``name``/``priority`` set in ``__init__``, ``sources_files()``,
``cxx_flags()``, ``is_available()``, ``assert_compatible()``, ...) registered as they are, through
the adapter (opforge/adopt.py): built by opforge, never by their own ``build_jit``/``load``.

ColossalAI's own CPU Adam classes, from its sdist, are in tests/clients/test_colossalai.py."""

from __future__ import annotations

import io
import itertools
import platform
import warnings

import pytest

import opforge
from opforge import adopt
from opforge import loader as loader_mod
from opforge.cli.report_cmd import candidate_json, collect, print_plain
from opforge.extension import TorchExtension
from opforge.loader import KernelLoader

pytestmark = [pytest.mark.filterwarnings("ignore::opforge.KernelFallbackWarning"),
              pytest.mark.filterwarnings("ignore::opforge.DeclarationWarning")]
_ids = itertools.count()

SOURCE = r"""
#include <pybind11/pybind11.h>
#include <string>
std::string isa() {
#if defined(__AVX512F__)
    return "avx512";
#elif defined(__AVX2__)
    return "avx2";
#elif defined(__ARM_NEON)
    return "neon";
#else
    return "scalar";
#endif
}
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("isa", &isa); m.def("triple", [](int x) { return 3 * x; }); }
"""


class SeedExtension:
    """Shaped as ColossalAI's ``_CppExtension``: the declaration is in ``__init__`` and in methods."""

    def __init__(self, name: str, priority: int = 1):
        self._name, self.priority = name, priority
        self._support_aot, self._support_jit = True, True

    name = property(lambda self: self._name)
    support_aot = property(lambda self: self._support_aot)
    support_jit = property(lambda self: self._support_jit)

    def is_available(self) -> bool:
        return True

    def assert_compatible(self) -> None:
        pass

    def include_dirs(self):
        return []

    def cxx_flags(self):
        return ["-O3", "-std=c++14", "-std=c++17", "-g0", "-Wno-reorder", "-fopenmp", "-march=native", ""]

    def nvcc_flags(self):
        return []

    def build_jit(self):
        raise AssertionError("opforge builds adopted classes itself; their build_jit must not be called")

    build_aot = load = build_jit


def seed_kind(tmp_path, class_name="SeedTriple", ext_name="seed{n}_triple", **methods):
    """A fresh kind with one ColossalAI-shaped class (``methods`` override its own) and a torch fallback."""
    n = next(_ids)
    src = tmp_path / f"seed{n}.cpp"
    src.write_text(SOURCE)
    name = ext_name.format(n=n)

    def init(self):
        SeedExtension.__init__(self, name=name, priority=2)

    theirs = type(f"{class_name}{n}", (SeedExtension,), {"__init__": init, "sources_files": lambda self: [str(src)],
                                                          **methods})

    class Loader(KernelLoader):
        pass

    Loader.kind = f"seed{n}"  # set after creation: out of the global kind registry
    assert Loader.register_extension(theirs) is theirs  # usable as a decorator: their class comes back
    Loader.register_extension(type(f"Ref{n}", (TorchExtension,), {"name": f"seed{n}_torch", "kind": Loader.kind,
                                                                   "module": "toy_reference"}))
    return Loader, theirs, name


def test_clean_flags_drops_native_and_all_but_the_last_std():
    flags, native, notes = adopt.clean_flags(["-O3", "-std=c++14", "-mtune=native", "-std=c++17", " ", "-DX=1"])
    assert flags == ["-O3", "-std=c++17", "-DX=1"] and native
    assert notes == ["-mtune=native (one variant per CPU ISA instead)", "-std=c++14 (-std=c++17 comes later)"]
    assert adopt.clean_flags(["-O2", "-std=c++17"]) == (["-O2", "-std=c++17"], False, [])


def test_native_becomes_one_variant_per_isa_and_the_best_builds_with_explicit_flags(cache_dir, tmp_path, counting_cxx):
    with pytest.warns(Warning, match=r"dropped -march=native \(one variant per CPU ISA instead\), -std=c\+\+14"):
        Loader, theirs, name = seed_kind(tmp_path)
    cands = Loader().candidates()
    assert [c.name for c in cands] == [f"{name}_avx512", f"{name}_avx2", f"{name}_neon", f"{name}_scalar",
                                       f"{Loader.kind}_torch"]
    assert {c.extension.priority for c in cands if c.name.startswith(name)} == {240, 230, 210}  # theirs x100 + ISA
    k = Loader().load(strict=True)
    best = next(c for c in cands if c.decision)
    assert k.name == best.name and k.origin == "built" and k.triple(7) == 21
    assert k.isa() == best.name.rsplit("_", 1)[1]  # the variant's own ISA flags, not the build host's
    (compile_cmd,) = counting_cxx.compiles()
    assert "-march=native" not in compile_cmd and "-std=c++14" not in compile_cmd and "-fopenmp" in compile_cmd
    report = candidate_json(next(c for c in Loader().candidates() if c.name == k.name))
    assert report["adopted_from"] == f"{theirs.__module__}.{theirs.__qualname__}"


def test_their_failed_assertion_is_rejected_with_its_message_and_the_loader_falls_back(cache_dir, tmp_path):
    def assert_compatible(self):
        raise AssertionError("[extension] needs CUDA 12")

    Loader, theirs, name = seed_kind(tmp_path, assert_compatible=assert_compatible)
    rejected = [c for c in Loader().candidates() if c.name.startswith(name) and c.available]
    assert rejected and all(c.compatible.reason == f"{theirs.__name__}.assert_compatible(): [extension] needs CUDA 12"
                            for c in rejected)
    assert Loader().load().backend == "torch"


def test_is_available_false_says_so_and_names_the_machine(cache_dir, tmp_path):
    Loader, theirs, name = seed_kind(tmp_path, is_available=lambda self: False)
    c = next(c for c in Loader().candidates() if c.name == f"{name}_scalar")
    assert c.available.reason == f"{theirs.__name__}.is_available() returned False on this {platform.machine()} machine"


def test_a_method_that_raises_while_read_rejects_the_extension_not_the_registration(cache_dir, tmp_path):
    def include_dirs(self):
        raise RuntimeError("CUDA_HOME is None, please set CUDA_HOME")

    Loader, theirs, name = seed_kind(tmp_path, include_dirs=include_dirs)
    c = next(c for c in Loader().candidates() if c.name == f"{name}_scalar")
    assert c.compatible.reason == (f"{theirs.__name__}.include_dirs() raised RuntimeError: CUDA_HOME is None, "
                                   "please set CUDA_HOME")


def test_without_native_it_is_one_extension_under_their_name(cache_dir, tmp_path):
    Loader, _, name = seed_kind(tmp_path, cxx_flags=lambda self: ["-O3", "-std=c++17"])
    (ours,) = [c for c in Loader().candidates() if c.name.startswith(name)]
    assert ours.name == name and ours.extension.priority == 210 and ours.extension.python_module


def test_adopting_twice_registers_the_same_extensions(tmp_path):
    Loader, theirs, name = seed_kind(tmp_path, cxx_flags=lambda self: ["-O3"])
    Loader.register_extension(theirs)
    assert [e.name for e in Loader.extensions()].count(name) == 1


def test_an_init_that_needs_arguments_is_refused_with_the_reason(tmp_path):
    class Loader(KernelLoader):
        pass

    Loader.kind = "seed_args"
    needs = type("NeedsArgs", (SeedExtension,), {"sources_files": lambda self: []})
    with pytest.raises(TypeError, match=r"NeedsArgs can't be adopted: opforge makes one instance with no arguments"):
        Loader.register_extension(needs)


def test_something_else_is_still_refused():
    class Loader(KernelLoader):
        pass

    with pytest.raises(TypeError, match=r"a subclass of opforge.Extension, or a class written the ColossalAI way"):
        Loader.register_extension(object)


# -- the architecture an adopted class is written for: only its own ISA variants (issue 33)

def _variants(Loader, name):
    return [c.name[len(name) + 1:] for c in Loader().candidates() if c.name.startswith(name + "_")]


@pytest.mark.parametrize("class_name, ext_name, variants", [
    ("CpuAdamArmExtension", "cpu_adam_arm{n}", ["neon", "scalar"]),  # ColossalAI's own names
    ("CpuAdamX86Extension", "cpu_adam_x86{n}", ["avx512", "avx2", "scalar"]),
    ("NeonKernel", "seed{n}_kernel", ["neon", "scalar"]),
    ("Avx2Kernel", "seed{n}_kernel", ["avx512", "avx2", "scalar"]),
    ("FarmKernel", "seed{n}_warmup", ["avx512", "avx2", "neon", "scalar"]),  # "arm" inside a word says nothing
])
def test_native_gives_only_the_variants_of_the_architecture_its_names_say(tmp_path, class_name, ext_name, variants):
    Loader, _, name = seed_kind(tmp_path, class_name=class_name, ext_name=ext_name)
    assert _variants(Loader, name) == variants


def test_their_flags_say_the_architecture_before_their_names(tmp_path):
    Loader, _, name = seed_kind(tmp_path, class_name="CpuAdamX86Extension",
                                cxx_flags=lambda self: ["-O3", "-march=native", "-march=armv8.2-a+fp16"])
    assert _variants(Loader, name) == ["neon", "scalar"]
    Loader, _, name = seed_kind(tmp_path, cxx_flags=lambda self: ["-O3", "-march=native", "-mavx2"])
    assert _variants(Loader, name) == ["avx512", "avx2", "scalar"]


class ArmOnly(SeedExtension):
    """Its names say nothing; its checks do, as ColossalAI's CpuAdamArmExtension's."""

    def is_available(self) -> bool:
        return platform.machine() == "aarch64"

    def assert_compatible(self) -> None:
        arch = platform.machine()
        assert arch == "aarch64", f"[extension] requires the CPU architecture to be aarch64 but got {arch}"


def test_their_checks_say_the_architecture(tmp_path):
    Loader, _, name = seed_kind(tmp_path, is_available=ArmOnly.is_available, assert_compatible=ArmOnly.assert_compatible)
    assert _variants(Loader, name) == ["neon", "scalar"]


def test_checks_with_no_source_to_read_say_nothing_and_all_variants_stay(tmp_path):
    checks = {}
    exec(compile("def is_available(self):\n    return __import__('platform').machine() == 'aarch64'\n",
                 "<ipython-input-4-def>", "exec"), checks)
    Loader, _, name = seed_kind(tmp_path, is_available=checks["is_available"])
    assert _variants(Loader, name) == ["avx512", "avx2", "neon", "scalar"]


def test_the_native_notice_is_a_declaration_warning_said_once(tmp_path):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        Loader, theirs, name = seed_kind(tmp_path, class_name="CpuAdamArmExtension")
        Loader.register_extension(theirs)
        Loader().candidates()
    said = [w for w in seen if "-march=native" in str(w.message)]
    assert [w.category for w in said] == [opforge.DeclarationWarning]
    assert str(said[0].message) == (
        f"{name} (test_adopt.{theirs.__qualname__}): opforge dropped -march=native (one variant per CPU ISA instead), "
        "-std=c++14 (-std=c++17 comes later); its variants are for aarch64 only: its names say aarch64 "
        f"({theirs.__name__})")
    assert not [w for w in seen if issubclass(w.category, opforge.KernelFallbackWarning)]


def test_the_report_has_no_empty_section_for_the_adopted_package(cache_dir, tmp_path, monkeypatch):
    Loader, theirs, name = seed_kind(tmp_path, cxx_flags=lambda self: ["-O3"])
    monkeypatch.setitem(loader_mod._LOADERS, Loader.kind, Loader)  # in the report, for this test only
    assert Loader().extensions()[0].aot_package == "test_adopt._C"  # a package that has no prebuilt record
    data = collect((Loader.kind,))
    out = io.StringIO()
    print_plain(data, out)
    text = out.getvalue()
    assert "prebuilt kernels of" not in text and "\nprebuilt kernels\n" in text  # opforge's own stays
    assert [p["package"] for p in data["packages"]] == ["test_adopt._C"]  # the JSON still lists it (present: false)
