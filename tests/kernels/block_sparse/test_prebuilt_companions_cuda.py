"""``OPFORGE_BUILD=block_sparse`` at ``pip install`` prebuilds all that block_sparse's first GPU calls would
otherwise compile: the C++ autograd node, the CUDA decode kernel (its companions) and native_launch's C++
variant (the kind it uses). A wheel of this checkout so built, installed in a fresh venv with an empty
cache, runs a decode forward (T=1 and 16: the CUDA kernel is in the route on sm_90) and a training step
with every one of them loaded from the package, and nothing built in opforge's cache."""

from __future__ import annotations

import json
import zipfile

import pytest
import torch
from wheels import build_wheel, checkout_copy, run_in, venv_with

pytestmark = pytest.mark.cuda
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

NAMES = ("block_sparse_autograd", "block_sparse_decode_cuda", "native_launch_cpp")
CODE = """
import json, os, sys, torch, opforge
from opforge.nn import BlockSparseLinear
from opforge.kernel_loader import NativeLaunchLoader
from opforge.kernels.block_sparse.cuda_decode import BlockSparseDecodeCuda
from opforge.kernels.block_sparse.native_autograd import BlockSparseAutograd
assert opforge.__file__.startswith(sys.prefix), opforge.__file__
torch.manual_seed(0)
layer = BlockSparseLinear(1024, 2048, density=0.25, block_shape=(64, 64), device="cuda", dtype=torch.bfloat16)
dense = layer.to_dense().detach()
for t in (1, 16):
    x = torch.randn(t, 1024, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        y = layer(x)
    ref = (x.double() @ dense.double().t() + layer.bias.double()).to(torch.bfloat16)
    torch.testing.assert_close(y, ref, rtol=2e-2, atol=2e-2)
x = torch.randn(64, 1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
layer(x).float().square().sum().backward()
assert x.grad is not None and layer.weight_blocks.grad is not None
torch.cuda.synchronize()
cache = os.environ["OPFORGE_CACHE_DIR"]
print(json.dumps({"origins": {"block_sparse_autograd": BlockSparseAutograd().load().origin,
                              "block_sparse_decode_cuda": BlockSparseDecodeCuda().load().origin,
                              "native_launch_cpp": NativeLaunchLoader().load().origin},
                  "native_launch": NativeLaunchLoader().load().name,
                  "cache": sorted(os.listdir(cache)) if os.path.isdir(cache) else []}))
"""


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("prebuilt-block-sparse")
    wheel, log = build_wheel(checkout_copy(tmp / "checkout"), tmp, {"OPFORGE_BUILD": "block_sparse"}, timeout=1200)
    return tmp, wheel, log, venv_with(tmp, wheel)


def test_the_wheel_carries_the_kind_whole(installed):
    _, wheel, log, _ = installed
    assert "opforge: OPFORGE_BUILD=block_sparse: building " + ", ".join(NAMES) in log
    with zipfile.ZipFile(wheel) as z:
        info = json.loads(z.read("opforge/_C/build_info.json"))
        files = set(z.namelist())
    assert set(info["extensions"]) == set(NAMES)
    for name in NAMES:
        assert f"opforge/_C/{info['extensions'][name]['file']}" in files
    assert info["extensions"]["block_sparse_decode_cuda"]["backend"] == "cuda"


def test_first_gpu_calls_compile_nothing_of_opforges(installed):
    tmp, _, _, py = installed
    out = json.loads(run_in(py, tmp, CODE, timeout=900).splitlines()[-1])
    assert out["origins"] == dict.fromkeys(NAMES, "prebuilt"), out
    assert out["native_launch"] == "native_launch_cpp"
    built = [n for n in out["cache"] if n in NAMES]
    assert not built, out["cache"]  # nothing of these in the JIT cache: no compile happened
