"""``torch.ops.opforge.adam_step_``: opcheck, and the same numbers as the loaded kernel."""

from __future__ import annotations

import pytest
import torch

import opforge.ops  # noqa: F401  (registers torch.ops.opforge.*)
from opforge.kernel_loader import CPUAdamLoader


@pytest.fixture(scope="module", autouse=True)
def _one_cache(shared_cache):
    """The session's cache: cpu_adam's variants are built once for the suite, not once per file."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OPFORGE_CACHE_DIR", str(shared_cache))
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


def multi_args(sizes=(37, 0, 5, 70_001), amsgrad=True, copy=True):
    """torch.ops.opforge.adam_step_multi_'s arguments: mixed param dtypes, steps that differ."""
    dtypes = (torch.float32, torch.bfloat16, torch.float16)
    gen = torch.Generator().manual_seed(len(sizes))

    def states():
        return [torch.rand(n, generator=gen) for n in sizes]

    params = [torch.randn(n, generator=gen).to(dtypes[i % 3]) for i, n in enumerate(sizes)]
    grads = [torch.randn(n, generator=gen).to(p.dtype) for n, p in zip(sizes, params)]
    return (params, grads, states(), states(), states() if amsgrad else [],
            [torch.empty(n, dtype=torch.bfloat16) for n in sizes] if copy else [],
            [torch.tensor(float(i)) for i in range(len(sizes))], 1e-2, 0.9, 0.999, 1e-8, 0.1, True, True, False, 2.0)


@pytest.mark.parametrize("amsgrad,copy", [(True, True), (False, False)])
def test_multi_opcheck(amsgrad, copy):
    torch.library.opcheck(torch.ops.opforge.adam_step_multi_.default,
                          multi_args(sizes=(37, 0, 5), amsgrad=amsgrad, copy=copy))


def test_multi_op_matches_the_kernel():
    a, b = multi_args(), multi_args()
    torch.ops.opforge.adam_step_multi_(*a)
    assert CPUAdamLoader().load().adam_step_multi_(*b, False, 2)
    for xs, ys in zip(a[:7], b[:7]):
        for x, y in zip(xs, ys):
            torch.testing.assert_close(x, y, rtol=0, atol=0)
    assert [float(t) for t in a[6]] == [1.0, 2.0, 3.0, 4.0]


def test_multi_op_under_torch_compile():
    def update(ps, gs, ms, vs, steps):
        torch.ops.opforge.adam_step_multi_(ps, gs, ms, vs, [], [], steps, 1e-2, 0.9, 0.999, 1e-8, 0.0, True, True,
                                           False, 1.0)
        return [p * 1 for p in ps]

    a = multi_args(sizes=(37, 5), amsgrad=False, copy=False)
    ps, gs, ms, vs, steps = a[0], a[1], a[2], a[3], a[6]
    b = [[t.clone() for t in ts] for ts in (ps, gs, ms, vs, steps)]
    out = torch.compile(update, fullgraph=True, backend="aot_eager")(ps, gs, ms, vs, steps)
    update(*b)
    for x, y in zip(out + ms + steps, b[0] + b[2] + b[4]):
        torch.testing.assert_close(x, y)
    assert [float(t) for t in steps] == [1.0, 2.0]
