"""``torch.ops.opforge.adam_step_``: opcheck, and the same numbers as the loaded kernel."""

from __future__ import annotations

import pytest
import torch

import opforge.ops  # noqa: F401  (registers torch.ops.opforge.*)
from opforge.kernel_loader import CPUAdamLoader


@pytest.fixture(scope="module", autouse=True)
def _one_cache(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OPFORGE_CACHE_DIR", str(tmp_path_factory.mktemp("adam-op-cache")))
        yield


def args(n=37, dtype=torch.float32, amsgrad=True, copy=True):
    gen = torch.Generator().manual_seed(n)
    p = torch.randn(n, generator=gen).to(dtype)
    return (p, torch.randn(n, generator=gen).to(dtype), torch.rand(n, generator=gen), torch.rand(n, generator=gen),
            torch.rand(n, generator=gen) if amsgrad else None, torch.empty(n, dtype=torch.bfloat16) if copy else None,
            1e-2, 0.9, 0.999, 1e-8, 0.1, 3, True, True, False, 2.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("amsgrad,copy", [(True, True), (False, False)])
def test_opcheck(dtype, amsgrad, copy):
    torch.library.opcheck(torch.ops.opforge.adam_step_.default, args(dtype=dtype, amsgrad=amsgrad, copy=copy))


def test_op_matches_the_kernel():
    a, b = args(), args()
    torch.ops.opforge.adam_step_(*a)
    CPUAdamLoader().load().adam_step_(*b, False, 1)
    for x, y in zip(a[:6], b[:6]):
        torch.testing.assert_close(x, y)


def test_op_under_torch_compile():
    def update(p, g, m, v):
        torch.ops.opforge.adam_step_(p, g, m, v, None, None, 1e-2, 0.9, 0.999, 1e-8, 0.0, 1, True, True, False, 1.0)
        return p * 1

    p, g, m, v = args(amsgrad=False, copy=False)[:4]
    p2, m2, v2 = p.clone(), m.clone(), v.clone()
    out = torch.compile(update, fullgraph=True, backend="aot_eager")(p, g, m, v)
    update(p2, g, m2, v2)
    torch.testing.assert_close(out, p2)
    torch.testing.assert_close(m, m2)
