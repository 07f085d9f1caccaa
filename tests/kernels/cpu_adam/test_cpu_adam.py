"""cpu_adam: every variant that runs here, forced through ext_name, against an fp64 reference
written here (not opforge's torch variant), over 10 steps.

Tolerances, per param dtype:

* fp32: the kernel computes in fp32 and the reference in fp64; after 10 steps the params
  differ by a few fp32 ulps of the update chain, so rtol 1e-5, atol 1e-6 (params ~ N(0, 1),
  lr 1e-2).
* bf16 / fp16: the reference rounds its param to the param dtype after each step, as the
  kernel stores it, and continues from the rounded value. The kernel rounds an fp32 result,
  the reference an fp64 one: when the exact value lies within an fp32 rounding of a tie the
  two round to neighbouring values, one ulp apart, and that can carry into later steps. So
  2 ulps: rtol 2^-7 for bf16 (8 significant bits), 2^-10 for fp16 (11 bits), plus an atol of
  one ulp at 1.0 for values near zero. The fp32 states are compared at rtol 1e-4 (they see
  the rounded params through weight decay).
"""

from __future__ import annotations

import math
import re

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from opforge.kernel_loader import CPUAdamLoader

STEPS = 10
SIZES = (1, 7, 15, 16, 17, 1023)
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
TOL = {torch.float32: (1e-5, 1e-6), torch.bfloat16: (2**-7, 2**-8), torch.float16: (2**-10, 2**-10)}
CONFIGS = {
    "adam": dict(adamw=False, weight_decay=0.0),
    "adam_l2": dict(adamw=False, weight_decay=0.1),
    "adamw": dict(adamw=True, weight_decay=0.1),
    "amsgrad": dict(adamw=True, weight_decay=0.1, amsgrad=True),
    "maximize": dict(adamw=False, weight_decay=0.1, maximize=True),
    "no_bias_correction": dict(adamw=True, weight_decay=0.0, bias_correction=False),
    "grad_scale": dict(adamw=True, weight_decay=0.1, grad_scale=1024.0),
}


def runnable():
    return [c.name for c in CPUAdamLoader().candidates() if c.decision]


VARIANTS = runnable()


@pytest.fixture(scope="module", autouse=True)
def _one_cache(shared_cache):
    """The session's cache: cpu_adam's variants are built once for the suite, not once per file."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OPFORGE_CACHE_DIR", str(shared_cache))
        yield


def kernel(name):
    return CPUAdamLoader().load(ext_name=name)


def reference_step(p, g, m, v, vmax, step, lr, beta1, beta2, eps, weight_decay, adamw, bias_correction, maximize,
                   grad_scale):
    """One Adam/AdamW step in fp64, as torch.optim.Adam/AdamW define it."""
    g = g / grad_scale
    if maximize:
        g = -g
    if adamw:
        p = p * (1 - lr * weight_decay)
    elif weight_decay:
        g = g + weight_decay * p
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    bc1 = 1 - beta1**step if bias_correction else 1.0
    bc2 = 1 - beta2**step if bias_correction else 1.0
    d = v
    if vmax is not None:
        vmax = torch.maximum(vmax, v)
        d = vmax
    p = p - (lr / bc1) * m / (d.sqrt() / math.sqrt(bc2) + eps)
    return p, m, v, vmax


def run_both(name, n, dtype, grad_dtype=None, seed=0, lr=1e-2, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0,
             adamw=True, bias_correction=True, maximize=False, amsgrad=False, grad_scale=1.0, copy_dtype=None):
    gen = torch.Generator().manual_seed(seed)
    grad_dtype = grad_dtype or dtype
    p = torch.randn(n, generator=gen).to(dtype)
    m, v = torch.zeros(n), torch.zeros(n)
    vmax = torch.zeros(n) if amsgrad else None
    copy = torch.empty(n, dtype=copy_dtype) if copy_dtype else None
    rp, rm, rv = p.double(), torch.zeros(n, dtype=torch.float64), torch.zeros(n, dtype=torch.float64)
    rvmax = torch.zeros(n, dtype=torch.float64) if amsgrad else None
    k = kernel(name)
    for step in range(1, STEPS + 1):
        g = (torch.randn(n, generator=gen) * grad_scale).to(grad_dtype)
        took = k.adam_step_(p, g, m, v, vmax, copy, lr, beta1, beta2, eps, weight_decay, step, adamw, bias_correction,
                            maximize, grad_scale, grad_scale != 1.0, 1)
        assert took
        rp, rm, rv, rvmax = reference_step(rp, g.double(), rm, rv, rvmax, step, lr, beta1, beta2, eps, weight_decay,
                                           adamw, bias_correction, maximize, grad_scale)
        rp = rp.to(dtype).double()  # stored in the param's dtype, as the kernel does
    return (p, m, v, vmax, copy), (rp, rm, rv, rvmax)


def check(got, want, dtype):
    (p, m, v, vmax, _), (rp, rm, rv, rvmax) = got, want
    rtol, atol = TOL[dtype]
    torch.testing.assert_close(p.double(), rp, rtol=rtol, atol=atol)
    torch.testing.assert_close(m.double(), rm, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(v.double(), rv, rtol=1e-4, atol=1e-8)
    if vmax is not None:
        torch.testing.assert_close(vmax.double(), rvmax, rtol=1e-4, atol=1e-8)


def test_the_best_variant_for_this_cpu_is_chosen():
    from opforge.platform import current

    chosen = [c for c in CPUAdamLoader().candidates() if c.chosen][0]
    cpu = current().cpu
    if cpu.has("avx512f", "avx512bw", "avx512vl"):
        assert chosen.name == "cpu_adam_avx512"
    elif cpu.has("avx2", "fma", "f16c"):
        assert chosen.name == "cpu_adam_avx2"
    assert "cpu_adam_torch" in VARIANTS


@pytest.mark.parametrize("name", VARIANTS)
def test_simd_width_is_the_isa_it_claims(name):
    want = {"cpu_adam_avx512": 16, "cpu_adam_avx2": 8, "cpu_adam_neon": 4, "cpu_adam_scalar": 1, "cpu_adam_torch": 0}
    assert kernel(name).simd_width() == want[name]


@pytest.mark.parametrize("config", sorted(CONFIGS))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", VARIANTS)
def test_matches_fp64_reference(name, dtype, config):
    for n in SIZES:  # the SIMD tails: below, at and above one vector, and many vectors
        got, want = run_both(name, n, dtype, seed=n, **CONFIGS[config])
        check(got, want, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", VARIANTS)
def test_large_tensor(name, dtype):
    got, want = run_both(name, 2**20 + 3, dtype, amsgrad=True, weight_decay=0.1)
    check(got, want, dtype)


@pytest.mark.parametrize("name", VARIANTS)
def test_fp32_grads_for_low_precision_params(name):
    for dtype in (torch.bfloat16, torch.float16):
        got, want = run_both(name, 1023, dtype, grad_dtype=torch.float32, weight_decay=0.1)
        check(got, want, dtype)


@pytest.mark.parametrize("copy_dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("name", VARIANTS)
def test_fused_low_precision_copy_rounds_like_torch(name, copy_dtype):
    got, _ = run_both(name, 1027, torch.float32, copy_dtype=copy_dtype)
    p, copy = got[0], got[4]
    assert torch.equal(copy.view(torch.int16) if copy_dtype == torch.bfloat16 else copy,
                       p.to(copy_dtype).view(torch.int16) if copy_dtype == torch.bfloat16 else p.to(copy_dtype))


@pytest.mark.parametrize("name", VARIANTS)
def test_bf16_rounding_is_nearest_even_and_keeps_nan(name):
    """Params chosen so that the update is exactly zero (lr 0): what is stored is the
    rounding of the fp32 value, which must equal torch's own .to(bfloat16), bit for bit."""
    specials = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1e-40, -1e-40, 3.4e38])
    ties = torch.tensor([1.0 + 2**-8, 1.0 + 3 * 2**-8, -(1.0 + 2**-8)])  # exactly halfway in bf16
    x = torch.cat([specials, ties, torch.randn(1000) * 100])
    # lr=0 keeps the fp32 value; the bf16 param holds it after one step only if the kernel rounds it:
    # so the value goes through the copy path (fp32 param -> bf16 copy).
    p = x.clone()
    copy = torch.empty_like(x, dtype=torch.bfloat16)
    g = torch.zeros_like(x)
    kernel(name).adam_step_(p, g, torch.zeros_like(x), torch.zeros_like(x), None, copy, 0.0, 0.9, 0.999, 1e-8, 0.0, 1,
                            True, True, False, 1.0, False, 1)
    want = x.to(torch.bfloat16)
    nan = torch.isnan(want)
    assert torch.isnan(copy[nan]).all()
    assert torch.equal(copy[~nan].view(torch.int16), want[~nan].view(torch.int16))


@pytest.mark.parametrize("name", VARIANTS)
def test_found_inf_skips_the_step(name):
    p, g = torch.randn(33), torch.randn(33)
    g[17] = float("inf")
    m, v = torch.zeros(33), torch.zeros(33)
    before = p.clone()
    took = kernel(name).adam_step_(p, g, m, v, None, None, 1e-2, 0.9, 0.999, 1e-8, 0.0, 1, True, True, False, 1024.0,
                                   True, 1)
    assert took is False
    assert torch.equal(p, before) and not m.any() and not v.any()


@pytest.mark.parametrize("name", VARIANTS)
def test_empty_param_is_a_no_op(name):
    e = torch.empty(0)
    assert kernel(name).adam_step_(e, e, e, e, None, None, 1e-3, 0.9, 0.999, 1e-8, 0.0, 1, True, True, False, 1.0,
                                   False, 1)


@pytest.mark.parametrize("name", VARIANTS)
def test_threads_give_the_same_result(name):
    outs = []
    for threads in (1, 2, 3):
        gen = torch.Generator().manual_seed(1)
        p, g = torch.randn(10_007, generator=gen), torch.randn(10_007, generator=gen)
        m, v = torch.zeros(10_007), torch.zeros(10_007)
        kernel(name).adam_step_(p, g, m, v, None, None, 1e-2, 0.9, 0.999, 1e-8, 0.1, 1, True, True, False, 1.0, False,
                                threads)
        outs.append(p)
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])


def bad_calls():
    n = 8
    ok = dict(p=torch.zeros(n), g=torch.zeros(n), m=torch.zeros(n), v=torch.zeros(n))
    cases = {
        "meta param (a device other than CPU)": dict(ok, p=torch.zeros(n, device="meta")),
        "sparse grad": dict(ok, g=torch.zeros(n).to_sparse()),
        "grad shape": dict(ok, g=torch.zeros(n + 1)),
        "integer param": dict(ok, p=torch.zeros(n, dtype=torch.int32)),
        "integer grad": dict(ok, g=torch.zeros(n, dtype=torch.int64)),
        "fp64 state": dict(ok, m=torch.zeros(n, dtype=torch.float64)),
    }
    return cases


@pytest.mark.parametrize("case", sorted(bad_calls()))
@pytest.mark.parametrize("name", VARIANTS)
def test_bad_input_is_a_clear_error(name, case):
    a = bad_calls()[case]
    with pytest.raises(RuntimeError, match="adam_step_|must|expected|differs"):
        kernel(name).adam_step_(a["p"], a["g"], a["m"], a["v"], None, None, 1e-3, 0.9, 0.999, 1e-8, 0.0, 1, True, True,
                                False, 1.0, False, 1)


@pytest.mark.parametrize("name", VARIANTS)
def test_non_contiguous_param_works_or_names_the_fix(name):
    """The C++ variants update in place through a flat pointer: they refuse, and say to call
    .contiguous(); the torch variant works on the strided view."""
    p = torch.randn(8, 4).t()
    g = torch.randn(4, 8)

    def step(param):
        return kernel(name).adam_step_(param, g, torch.zeros(32), torch.zeros(32), None, None, 1e-3, 0.9, 0.999, 1e-8,
                                       0.0, 1, True, True, False, 1.0, False, 1)

    if name == "cpu_adam_torch":
        want = p.contiguous()
        step(want)
        step(p)
        torch.testing.assert_close(p, want)
    else:
        with pytest.raises(RuntimeError, match="contiguous"):
            step(p)


# --- adam_step_multi_: a list of params in one call, each at its own step

# Odd sizes, an empty one, and one larger than kMinPerThread (32768) x 2 threads, so that a
# thread's range of the list spans tensor boundaries.
MULTI_SIZES = (17, 0, 1, 70_001, 1023, 5)


def hyper(config):
    """adam_step_'s scalar arguments for a CONFIGS entry (lr ... grad_scale), and amsgrad."""
    c = {"lr": 1e-2, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "bias_correction": True, "maximize": False,
         "grad_scale": 1.0, **CONFIGS[config]}
    amsgrad = c.pop("amsgrad", False)
    names = ("lr", "beta1", "beta2", "eps", "weight_decay", "adamw", "bias_correction", "maximize", "grad_scale")
    return tuple(c[k] for k in names), amsgrad


def multi_lists(seed, amsgrad, copies, sizes=MULTI_SIZES):
    """The multi op's tensor lists: param dtypes mixed within the list, grads in another dtype
    than their param, states not zero, and steps taken that differ from param to param."""
    gen = torch.Generator().manual_seed(seed)

    def states():
        return [torch.rand(n, generator=gen) * 1e-2 for n in sizes]

    params = [torch.randn(n, generator=gen).to(DTYPES[i % 3]) for i, n in enumerate(sizes)]
    grads = [torch.randn(n, generator=gen).to(DTYPES[(i + 1) % 3]) for i, n in enumerate(sizes)]
    maxes = states() if amsgrad else []
    outs = [torch.empty(n, dtype=DTYPES[(i + 2) % 3]) for i, n in enumerate(sizes)] if copies else []
    steps = [torch.tensor(float(i % 4)) for i in range(len(sizes))]
    return [params, grads, states(), states(), maxes, outs, steps]


def clone(lists):
    return [[t.clone() for t in ts] for ts in lists]


def per_param(k, lists, scalars, check_finite):
    """adam_step_ on each param in turn, as CPUAdam did before adam_step_multi_."""
    params, grads, ms, vs, maxes, outs, steps = lists
    for i in range(len(params)):
        steps[i] += 1
        k.adam_step_(params[i], grads[i], ms[i], vs[i], maxes[i] if maxes else None, outs[i] if outs else None,
                     *scalars[:5], int(steps[i]), *scalars[5:], check_finite, 1)


def assert_bitwise_equal(got, want):
    for ts, us in zip(got, want):
        for t, u in zip(ts, us):
            assert t.dtype == u.dtype and torch.equal(t.view(-1).view(torch.uint8), u.view(-1).view(torch.uint8))


@pytest.mark.parametrize("copies", [False, True], ids=["no_copies", "copies"])
@pytest.mark.parametrize("config", sorted(CONFIGS))
@pytest.mark.parametrize("name", VARIANTS)
def test_multi_is_the_per_param_op_bit_for_bit(name, config, copies):
    scalars, amsgrad = hyper(config)
    k, start = kernel(name), multi_lists(len(config), amsgrad, copies)
    want = clone(start)
    for _ in range(3):
        per_param(k, want, scalars, scalars[-1] != 1.0)
    for threads in (1, 2, 3):
        got = clone(start)
        for _ in range(3):
            assert k.adam_step_multi_(*got, *scalars, scalars[-1] != 1.0, threads)
        assert_bitwise_equal(got, want)
    assert [float(t) for t in got[-1]] == [float(t) + 3 for t in start[-1]]


@pytest.mark.parametrize("config", sorted(CONFIGS))
@pytest.mark.parametrize("name", VARIANTS)
def test_multi_matches_fp64_reference(name, config):
    scalars, amsgrad = hyper(config)
    got = multi_lists(7, amsgrad, copies=False)
    want = [[t.double() for t in ts] for ts in got[:5]]
    want[4] = want[4] or [None] * len(got[0])
    gen = torch.Generator().manual_seed(8)
    for _ in range(STEPS):
        got[1] = [(torch.randn(g.numel(), generator=gen) * scalars[-1]).to(g.dtype) for g in got[1]]
        steps = [float(t) + 1 for t in got[6]]
        assert kernel(name).adam_step_multi_(*got, *scalars, False, 2)
        assert [float(t) for t in got[6]] == steps
        for i, (p, _, m, v, vmax) in enumerate(zip(*want)):
            p, m, v, vmax = reference_step(p, got[1][i].double(), m, v, vmax, steps[i], *scalars)
            want[0][i], want[2][i], want[3][i], want[4][i] = p.to(got[0][i].dtype).double(), m, v, vmax
    for i, dtype in enumerate(t.dtype for t in got[0]):
        check([got[0][i], got[2][i], got[3][i], got[4][i] if amsgrad else None, None],
              [want[0][i], want[2][i], want[3][i], want[4][i]], dtype)


@pytest.mark.parametrize("name", VARIANTS)
def test_multi_many_small_tensors(name):
    """Hundreds of tensors, so that each thread's range holds many of them."""
    sizes = [int(x) for x in torch.randint(0, 200, (600,), generator=torch.Generator().manual_seed(3))]
    scalars, _ = hyper("adamw")
    start = multi_lists(3, amsgrad=False, copies=True, sizes=sizes)
    want, got = clone(start), clone(start)
    per_param(kernel(name), want, scalars, False)
    assert kernel(name).adam_step_multi_(*got, *scalars, False, 2)
    assert_bitwise_equal(got, want)


@pytest.mark.parametrize("name", VARIANTS)
def test_multi_found_inf_skips_the_whole_step(name):
    scalars, _ = hyper("grad_scale")
    for bad in (float("inf"), float("nan")):
        start = multi_lists(5, amsgrad=True, copies=True)
        start[1][3][40_000] = bad  # in the big tensor, in the second thread's range
        got = clone(start)
        assert kernel(name).adam_step_multi_(*got, *scalars, True, 2) is False
        assert_bitwise_equal(got, start)  # params, states, copies and steps untouched


@pytest.mark.parametrize("name", VARIANTS)
def test_multi_empty_lists_are_a_no_op(name):
    assert kernel(name).adam_step_multi_([], [], [], [], [], [], [], *hyper("adam")[0], True, 1)


def multi_bad_calls():
    """name -> (how to spoil the lists, what the message must say)."""

    def put(which, i, t):
        def spoil(lists):
            lists[which][i] = t

        return spoil

    return {
        "grads list too short": (lambda ls: ls[1].pop(), r"grads"),
        "steps list too long": (lambda ls: ls[6].append(torch.tensor(0.0)), r"steps"),
        "max_exp_avg_sqs neither empty nor one per param": (lambda ls: ls[4].append(torch.zeros(1)),
                                                            r"max_exp_avg_sqs"),
        "integer param": (put(0, 2, torch.zeros(1, dtype=torch.int32)), r"params\[2\]"),
        "meta param": (put(0, 4, torch.zeros(1023, device="meta")), r"params\[4\]"),
        "grad shape": (put(1, 3, torch.zeros(70_002)), r"\[3\]"),
        "sparse grad": (put(1, 0, torch.zeros(17).to_sparse()), r"\[0\]"),
        "fp64 state": (put(3, 5, torch.zeros(5, dtype=torch.float64)), r"exp_avg_sqs?\[5\]|\[5\].*exp_avg_sq"),
        "state size": (put(2, 1, torch.zeros(2)), r"\[1\]"),
        "fp64 step": (put(6, 2, torch.tensor(1.0, dtype=torch.float64)), r"steps\[2\]"),
        "step on meta": (put(6, 0, torch.tensor(1.0, device="meta")), r"steps\[0\]"),
        "step of two elements": (put(6, 1, torch.zeros(2)), r"steps\[1\]"),
        "negative step": (put(6, 3, torch.tensor(-2.0)), r"steps\[3\]"),
    }


@pytest.mark.parametrize("case", sorted(multi_bad_calls()))
@pytest.mark.parametrize("name", VARIANTS)
def test_multi_bad_input_is_a_clear_error_and_writes_nothing(name, case):
    spoil, message = multi_bad_calls()[case]
    got = multi_lists(9, amsgrad=False, copies=False)
    spoil(got)
    before = clone(got)
    with pytest.raises(RuntimeError, match=f"adam_step_multi_: .*({message})"):
        kernel(name).adam_step_multi_(*got, *hyper("adamw")[0], False, 2)
    for ts, us in zip(got, before):  # all checked before anything is written: steps too are as they were
        for t, u in zip(ts, us):
            if t.device.type == "cpu" and t.layout == torch.strided:
                assert torch.equal(t, u)


@pytest.mark.parametrize("name", [v for v in VARIANTS if v != "cpu_adam_torch"])
def test_multi_shared_memory_is_refused_unless_only_read(name):
    """The C++ variants update the list in parallel: a buffer written for one param may not be
    any other buffer of the call. (The torch variant goes param by param: sharing is no race.)"""
    k, scalars = kernel(name), hyper("adamw")[0]
    flat = torch.zeros(300)
    lists = multi_lists(4, amsgrad=False, copies=False, sizes=(100, 100, 100))
    lists[2] = list(flat.split(100))  # views of one buffer that do not overlap: fine
    lists[1] = [lists[1][0]] * 3  # one grad for all three: only read, fine
    lists[0] = [p.float() for p in lists[0]]
    lists[1] = [g.float() for g in lists[1]]
    assert k.adam_step_multi_(*lists, *scalars, False, 2)
    for spoil, message in [
        (lambda ls: ls[3].__setitem__(2, ls[3][0]), r"exp_avg_sqs\[0\] and exp_avg_sqs\[2\] share memory"),
        (lambda ls: ls[0].__setitem__(1, ls[1][0]), r"grads\[0\] and params\[1\] share memory"),
        (lambda ls: ls[2].__setitem__(1, flat[50:150]), r"exp_avgs\[\d\] and exp_avgs\[\d\] share memory"),
        (lambda ls: ls[6].__setitem__(2, ls[6][1]), r"steps\[1\] and steps\[2\] share memory"),
    ]:
        bad = [ts[:] for ts in lists]
        spoil(bad)
        with pytest.raises(RuntimeError, match=message):
            k.adam_step_multi_(*bad, *scalars, False, 2)


# --- fuzzing (hypothesis): any size, shape, dtype mix and hyperparameters

HYPER = st.fixed_dictionaries({
    "lr": st.floats(1e-5, 0.1), "beta1": st.floats(0.0, 0.99), "beta2": st.floats(0.5, 0.9999),
    "eps": st.floats(1e-10, 1e-3), "weight_decay": st.sampled_from([0.0, 0.01, 0.3]), "adamw": st.booleans(),
    "bias_correction": st.booleans(), "maximize": st.booleans(),
    "grad_scale": st.sampled_from([1.0, 0.5, 1024.0]),
})
NAMES = ("lr", "beta1", "beta2", "eps", "weight_decay", "adamw", "bias_correction", "maximize", "grad_scale")


@given(st.data())
def test_fuzz_against_fp64_reference(data):
    """Every variant that runs here, any shape (SIMD tails: sizes around 16-lane multiples), param
    dtype, grad dtype, fused copy dtype, states not zero, starting at any step, any hyperparameters,
    with amsgrad or not, against the fp64 reference; a non-finite grad skips the step untouched."""
    name = data.draw(st.sampled_from(VARIANTS), label="variant")
    shape = data.draw(st.lists(st.integers(0, 40), min_size=1, max_size=3), label="shape")
    dtype = data.draw(st.sampled_from(DTYPES), label="param dtype")
    grad_dtype = data.draw(st.sampled_from([dtype, torch.float32]), label="grad dtype")
    copy_dtype = data.draw(st.sampled_from([None, torch.bfloat16, torch.float16, torch.float32]), label="copy dtype")
    h = data.draw(HYPER, label="hyperparameters")
    amsgrad = data.draw(st.booleans(), label="amsgrad")
    start = data.draw(st.integers(0, 1000), label="steps already taken")
    steps = data.draw(st.integers(1, 3), label="steps")
    poison = data.draw(st.sampled_from([None, float("inf"), float("-inf"), float("nan")]), label="bad grad")
    seed = data.draw(st.integers(0, 2**16), label="seed")
    gen = torch.Generator().manual_seed(seed)
    p = torch.randn(shape, generator=gen).to(dtype)
    m = torch.randn(shape, generator=gen) * 0.1 if start else torch.zeros(shape)
    v = torch.rand(shape, generator=gen) * 0.1 if start else torch.zeros(shape)
    vmax = v * 1.5 if amsgrad else None
    copy = torch.empty(shape, dtype=copy_dtype) if copy_dtype else None
    scalars = [h[k] for k in NAMES]
    k = kernel(name)
    rtol, atol = TOL[dtype]
    for step in range(start + 1, start + steps + 1):
        g = (torch.randn(shape, generator=gen) * h["grad_scale"]).to(grad_dtype)
        if poison is not None and g.numel() and step == start + steps:
            g.view(-1)[int(torch.randint(g.numel(), (1,), generator=gen))] = poison
            before = [t.clone() for t in (p, m, v) + ((vmax,) if amsgrad else ())]
            took = k.adam_step_(p, g, m, v, vmax, copy, *scalars[:5], step, *scalars[5:], True, 1)
            assert took is False
            assert all(torch.equal(t, u) for t, u in zip((p, m, v) + ((vmax,) if amsgrad else ()), before))
            break
        # each step against the fp64 step from the kernel's own state: a half-precision param that rounds to
        # the other neighbour at one step would otherwise carry that ulp, through the L2 weight decay, into the
        # next step's v, beyond v's fp32 tolerance
        want = list(reference_step(p.double(), g.double(), m.double(), v.double(),
                                   None if vmax is None else vmax.double(), step, *scalars))
        want[0] = want[0].to(dtype).double()  # stored in the param's dtype, as the kernel does
        assert k.adam_step_(p, g, m, v, vmax, copy, *scalars[:5], step, *scalars[5:], False, 1)
        if copy is not None:
            torch.testing.assert_close(copy, p.to(copy_dtype), rtol=0, atol=0)
        torch.testing.assert_close(p.double(), want[0], rtol=rtol, atol=atol)
        torch.testing.assert_close(m.double(), want[1], rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(v.double(), want[2], rtol=1e-4, atol=1e-8)
        if amsgrad:
            torch.testing.assert_close(vmax.double(), want[3], rtol=1e-4, atol=1e-8)


@given(st.data())
def test_fuzz_multi_is_the_per_param_op_bit_for_bit(data):
    """Any list of sizes (empty ones too), dtype mix, hyperparameters and thread count: the
    multi op gives exactly what adam_step_ gives param by param."""
    name = data.draw(st.sampled_from(VARIANTS), label="variant")
    sizes = tuple(data.draw(st.lists(st.integers(0, 3000), max_size=6), label="sizes"))
    h = data.draw(HYPER, label="hyperparameters")
    amsgrad, copies = data.draw(st.booleans(), label="amsgrad"), data.draw(st.booleans(), label="copies")
    threads = data.draw(st.integers(1, 4), label="threads")
    scalars = tuple(h[k] for k in NAMES)
    k, start = kernel(name), multi_lists(data.draw(st.integers(0, 2**16), label="seed"), amsgrad, copies, sizes)
    want, got = clone(start), clone(start)
    per_param(k, want, scalars, True)
    assert k.adam_step_multi_(*got, *scalars, True, threads)
    assert_bitwise_equal(got, want)


def test_report_lists_the_family(capsys):
    from opforge.cli.main import main

    assert main(["report", "cpu_adam"]) == 0
    out = capsys.readouterr().out
    assert "cpu_adam_avx512" in out and "cpu_adam_torch" in out
    assert re.search(r"^cpu_adam\b.*chooses cpu_adam_\w+", out, re.MULTILINE)
