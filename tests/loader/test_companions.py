"""Companions (``KernelLoader.register_companion``): extensions a kind's variants load by themselves
(block_sparse's C++ autograd node and CUDA decode kernel, bias_act's node). The loader never chooses
one, but ``OPFORGE_BUILD=<kind>``, ``opforge build <kind>`` and ``opforge report`` treat it as part of
the kind, with the kinds its loader ``uses``, so a first call after either compiles nothing."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import ROOT
from test_loader import AXPY, COMMON, GCC, HASWELL, NINJA, toy_kind

from opforge import aot
from opforge.cli import build_cmd, report_cmd
from opforge.compat import TorchFacts
from opforge.extension import NEEDS_BUILD, CppExtension, TorchExtension
from opforge.kernel_loader import BiasActLoader, BlockSparseLoader, NativeLaunchLoader
from opforge.kernels.bias_act.native_autograd import BiasActAutograd
from opforge.kernels.block_sparse.cuda_decode import BlockSparseDecodeCuda
from opforge.kernels.block_sparse.native_autograd import BlockSparseAutograd
from opforge.loader import registered_extension
from opforge.platform import Gpu, Platform
from opforge.selection import with_used


def with_companion():
    Loader, Cpp, Torch, Never, Broken = toy_kind()

    @Loader.register_companion
    class Node(CppExtension):
        name, sources, stable_abi = f"{Loader.kind}_node", (AXPY,), "2.10"
        include_dirs = (COMMON,)

    return Loader, Cpp, Torch, Node


def test_a_companion_is_never_chosen_but_is_listed_with_its_state(cache_dir):
    Loader, Cpp, Torch, Node = with_companion()
    assert Node.kind == Loader.kind and registered_extension(Node.name) is Node
    assert Node.name not in [e.name for e in Loader.extensions()]
    assert Node.name not in [c.name for c in Loader().candidates(HASWELL)]
    (c,) = Loader().companion_candidates(HASWELL)
    assert c.name == Node.name and bool(c.decision) and not c.chosen and c.status.state == NEEDS_BUILD
    # with no compiler it is still listed, and says why it can't be had
    (c,) = Loader().companion_candidates(Platform(cpu=HASWELL.cpu, ninja=NINJA))
    assert not c.decision and "no C++ compiler" in c.decision.reason


def test_register_companion_refuses_non_extensions_wrong_kinds_and_double_duty():
    Loader, Cpp, Torch, Node = with_companion()
    with pytest.raises(TypeError, match="register_companion takes a subclass of opforge.Extension"):
        Loader.register_companion(Node())

    class Other(TorchExtension):
        name, kind, module = f"{Loader.kind}_other", "something_else", "toy_reference"

    with pytest.raises(TypeError, match="is of kind 'something_else'"):
        Loader.register_companion(Other)

    class Dup(TorchExtension):
        name, module = Cpp.name, "toy_reference"

    with pytest.raises(ValueError, match=f"{Cpp.name!r} is already registered"):
        Loader.register_companion(Dup)
    with pytest.raises(ValueError, match="as a variant and as a companion"):
        Loader.register_companion(Cpp)
    with pytest.raises(ValueError, match="as a variant and as a companion"):
        Loader.register_extension(Node)


def test_opforges_own_companions_and_the_kinds_they_use():
    assert [e.name for e in BlockSparseLoader.companions()] == ["block_sparse_autograd", "block_sparse_decode_cuda"]
    assert BlockSparseLoader.uses == ("native_launch",)
    assert [e.name for e in BiasActLoader.companions()] == ["bias_act_autograd"]
    assert registered_extension("bias_act_autograd") is BiasActAutograd
    assert with_used("block_sparse", {"block_sparse": ("native_launch",)}) == ["block_sparse", "native_launch"]


def test_an_autograd_node_is_offered_only_with_a_gpu_torch():
    cpu_torch = Platform(cpu=HASWELL.cpu, cxx=GCC, ninja=NINJA, torch=TorchFacts("2.13.0+cpu"))
    cuda_torch = Platform(cpu=HASWELL.cpu, cxx=GCC, ninja=NINJA, torch=TorchFacts("2.11.0+cu130", cuda="13.0"),
                          gpus=(Gpu(0, "H200", "nvidia", (9, 0), "sm_90"),))
    for node in (BlockSparseAutograd(), BiasActAutograd()):
        verdict = node.is_available(cpu_torch)
        assert not verdict and "has no CUDA or ROCm" in verdict.reason
        assert node.is_available(cuda_torch)
    assert BlockSparseDecodeCuda().is_available(cuda_torch)


def test_opforge_build_of_a_kind_builds_its_companions_and_the_kinds_it_uses(cache_dir):
    known = {"block_sparse": BlockSparseLoader, "native_launch": NativeLaunchLoader}
    chosen, error = build_cmd.selection(["block_sparse"], False, known)
    assert error is None and chosen == {"block_sparse": None, "native_launch": None}
    gpu = Platform(cpu=HASWELL.cpu, cxx=GCC, ninja=NINJA, torch=TorchFacts("2.13.0+cpu"))
    planned = {p.name: p for p in build_cmd.plan(chosen, known, gpu, None)}
    assert {"block_sparse_autograd", "block_sparse_decode_cuda", "native_launch_cpp"} <= set(planned)
    assert planned["native_launch_cpp"].skip is None  # a variant of the kind it uses: built
    assert "has no CUDA or ROCm" in planned["block_sparse_autograd"].skip  # with this CPU torch, of no use
    assert "NVIDIA GPU" in planned["block_sparse_decode_cuda"].skip
    # an extension's own name still selects that one alone
    chosen, error = build_cmd.selection(["block_sparse_autograd"], False, known)
    assert error is None and chosen == {"block_sparse": {"block_sparse_autograd"}}


def test_opforge_build_at_install_takes_a_kind_whole(capsys):
    """``OPFORGE_BUILD=block_sparse`` (setup.py's kwargs, no compile): its companions and native_launch's C++
    variant are asked for; on this CPU torch the ones of no use here are left out, each with the reason."""
    kwargs = aot.setup_kwargs("block_sparse")
    out = capsys.readouterr().out
    assert [m.name for m in kwargs["ext_modules"]] == ["opforge._C.native_launch_cpp"]
    assert "opforge: OPFORGE_BUILD=block_sparse: building native_launch_cpp" in out
    assert "block_sparse_autograd (it drives GPU kernels, and this torch has no CUDA or ROCm)" in out
    assert "block_sparse_decode_cuda (this torch has no CUDA)" in out
    # a companion is asked for by name like any extension
    with pytest.raises(ValueError, match="extensions: .*block_sparse_decode_cuda"):
        aot.setup_kwargs("block_sparse_nope")


def test_a_gpu_torch_build_host_builds_the_companions():
    from opforge.registry import loaders

    kinds = loaders().values()
    exts = {e.name: e for cls in kinds for e in (*cls.extensions(), *cls.companions())}
    wanted = aot.parse_request("block_sparse", exts, uses={c.kind: c.uses for c in kinds})
    assert [e.name for e in wanted] == ["block_sparse_autograd", "block_sparse_decode_cuda", "native_launch_cpp"]
    verdicts = {e.name: aot.buildable(e, "x86_64", "13.0", True) for e in wanted}
    assert all(verdicts.values()), verdicts
    assert not aot.buildable(BlockSparseDecodeCuda(), "x86_64", "13.0", False)  # no nvcc: said, not built


def test_report_lists_companions_after_the_variants(cache_dir, capsys):
    data = report_cmd.collect(("block_sparse",))
    (k,) = data["kinds"]
    assert [c["name"] for c in k["companions"]] == ["block_sparse_autograd", "block_sparse_decode_cuda"]
    assert not any(c["chosen"] for c in k["companions"]) and k["chosen"] != "block_sparse_autograd"
    report_cmd.print_plain(data)
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if "block_sparse_autograd" in line)
    assert row.split()[:4] == ["+", "block_sparse_autograd", "cpp", "-"]
    assert "(+ = a companion" in out


def test_registering_the_kinds_imports_no_companions_runtime_code():
    """The companions are declared in their kinds' extensions.py: a warm start that imports the loaders
    (``CPUAdamLoader().load()``) does not pay for the decode route's or the autograd nodes' modules."""
    code = ("import sys, opforge.kernel_loader; print(sorted(m for m in sys.modules if m.endswith(("
            "'.cuda_decode', '.native_autograd', '.triton_launch', '.tuned_op'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"
