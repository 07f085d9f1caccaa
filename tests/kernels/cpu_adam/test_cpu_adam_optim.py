"""opforge.optim.CPUAdam: against torch.optim.Adam/AdamW step for step, checkpoints that move
both ways, lr schedulers, GradScaler, DeepSpeedCPUAdam's argument names, bad input."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from opforge.kernel_loader import CPUAdamLoader
from opforge.optim import CPUAdam

VARIANTS = [c.name for c in CPUAdamLoader().candidates() if c.decision]


@pytest.fixture(scope="module", autouse=True)
def _one_cache(shared_cache):
    """The session's cache: cpu_adam's variants are built once for the suite, not once per file."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OPFORGE_CACHE_DIR", str(shared_cache))
        yield


def model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(13, 33), torch.nn.GELU(), torch.nn.Linear(33, 5))


def train(m, opt, steps, seed=1, sched=None):
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(16, 13, generator=gen)
        opt.zero_grad()
        m(x).pow(2).mean().backward()
        opt.step()
        if sched is not None:
            sched.step()


def assert_same_params(a, b, rtol=1e-5, atol=1e-6):
    for pa, pb in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(pa, pb, rtol=rtol, atol=atol)


@pytest.mark.parametrize("name", VARIANTS)
@pytest.mark.parametrize("adamw", [True, False])
def test_matches_torch_step_for_step(name, adamw):
    ours, theirs = model(), model()
    kw = dict(lr=1e-2, betas=(0.8, 0.99), eps=1e-7, weight_decay=0.05, amsgrad=True)
    opt = CPUAdam(ours.parameters(), adamw_mode=adamw, ext_name=name, **kw)
    ref = (torch.optim.AdamW if adamw else torch.optim.Adam)(theirs.parameters(), **kw)
    train(ours, opt, 10)
    train(theirs, ref, 10)
    assert_same_params(ours, theirs)


@pytest.mark.parametrize("name", VARIANTS)
def test_checkpoints_move_to_torch_and_back(name):
    a, b = model(), model()
    opt_a = CPUAdam(a.parameters(), lr=1e-2, weight_decay=0.1, ext_name=name)
    train(a, opt_a, 5)
    b.load_state_dict(a.state_dict())
    opt_b = torch.optim.AdamW(b.parameters(), lr=1e-2, weight_decay=0.1)
    opt_b.load_state_dict(copy.deepcopy(opt_a.state_dict()))  # ours -> torch (a copy: state_dict shares tensors)
    assert set(opt_b.state_dict()["state"][0]) == {"step", "exp_avg", "exp_avg_sq"}
    train(a, opt_a, 5, seed=2)
    train(b, opt_b, 5, seed=2)
    assert_same_params(a, b)
    c = model()
    c.load_state_dict(b.state_dict())
    opt_c = CPUAdam(c.parameters(), lr=1.0, ext_name=name)  # the checkpoint's lr and decay win
    opt_c.load_state_dict(copy.deepcopy(opt_b.state_dict()))  # torch -> ours
    train(b, opt_b, 5, seed=3)
    train(c, opt_c, 5, seed=3)
    assert_same_params(b, c)


def test_lr_scheduler_drives_it_like_torch():
    ours, theirs = model(), model()
    opt = CPUAdam(ours.parameters(), lr=1e-2)
    ref = torch.optim.AdamW(theirs.parameters(), lr=1e-2, weight_decay=0.0)
    s1 = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    s2 = torch.optim.lr_scheduler.StepLR(ref, step_size=3, gamma=0.5)
    train(ours, opt, 8, sched=s1)
    train(theirs, ref, 8, sched=s2)
    assert opt.param_groups[0]["lr"] == ref.param_groups[0]["lr"] == 1e-2 * 0.5**2
    assert_same_params(ours, theirs)


def test_param_groups_keep_their_own_settings():
    m = model()
    opt = CPUAdam([{"params": m[0].parameters(), "lr": 0.0}, {"params": m[2].parameters()}], lr=1e-2)
    before = [p.clone() for p in m[0].parameters()]
    train(m, opt, 2)
    assert all(torch.equal(p, q) for p, q in zip(m[0].parameters(), before))  # lr 0: untouched


def test_deepspeed_argument_names_and_low_precision_copies():
    m = model()
    opt = CPUAdam(model_params=m.parameters(), lr=1e-2, bias_correction=True, fp32_optimizer_states=True)
    copies = [torch.empty_like(p, dtype=torch.bfloat16) for p in m.parameters()]
    x = torch.randn(4, 13)
    m(x).sum().backward()
    opt.step(fp16_param_groups=[copies])
    for p, c in zip(m.parameters(), copies):
        assert torch.equal(c, p.detach().to(torch.bfloat16))
    with pytest.raises(ValueError, match="fp32_optimizer_states=False is not supported"):
        CPUAdam(m.parameters(), fp32_optimizer_states=False)


def test_grad_scaler_unscales_and_skips_infs():
    ours, theirs = model(), model()
    opt = CPUAdam(ours.parameters(), lr=1e-2)
    ref = torch.optim.AdamW(theirs.parameters(), lr=1e-2, weight_decay=0.0)
    s1, s2 = torch.amp.GradScaler("cpu", init_scale=1024.0), torch.amp.GradScaler("cpu", init_scale=1024.0)
    gen = torch.Generator().manual_seed(0)
    for i in range(4):
        x = torch.randn(8, 13, generator=gen)
        if i == 2:
            x[0, 0] = float("inf")  # an overflow: the step is skipped and the scale halves
        for m, o, s in ((ours, opt, s1), (theirs, ref, s2)):
            o.zero_grad()
            s.scale(m(x).pow(2).mean()).backward()
            s.step(o)
            s.update()
    assert s1.get_scale() == s2.get_scale() == 512.0
    assert_same_params(ours, theirs)


def test_low_precision_params_train():
    m = model().to(torch.bfloat16)
    opt = CPUAdam(m.parameters(), lr=1e-2)
    first = [p.clone() for p in m.parameters()]
    train_bf16 = torch.randn(16, 13).to(torch.bfloat16)
    for _ in range(3):
        opt.zero_grad()
        m(train_bf16).float().pow(2).mean().backward()
        opt.step()
    assert all(not torch.equal(p, q) for p, q in zip(m.parameters(), first))
    assert all(opt.state[p]["exp_avg"].dtype == torch.float32 for p in m.parameters())


def test_non_contiguous_param_is_updated():
    w = torch.nn.Parameter(torch.randn(6, 4).t())  # a transposed view
    ref = torch.nn.Parameter(w.detach().clone())
    opt, topt = CPUAdam([w], lr=1e-2), torch.optim.AdamW([ref], lr=1e-2, weight_decay=0.0)
    for o, p in ((opt, w), (topt, ref)):
        p.grad = torch.ones_like(p)
        o.step()
    torch.testing.assert_close(w, ref)


def test_bad_input_is_a_clear_error():
    with pytest.raises(ValueError, match="CPU memory, but one is on meta"):
        CPUAdam([torch.nn.Parameter(torch.zeros(3, device="meta"))])
    with pytest.raises(ValueError, match="not torch.int64"):
        CPUAdam([torch.zeros(3, dtype=torch.int64)])
    with pytest.raises(ValueError, match="invalid betas"):
        CPUAdam([torch.nn.Parameter(torch.zeros(3))], betas=(1.0, 0.999))
    with pytest.raises(TypeError, match="needs the parameters"):
        CPUAdam()
    w = torch.nn.Parameter(torch.zeros(3))
    with warnings.catch_warnings():  # torch warns first (and may raise itself one day)
        warnings.simplefilter("ignore")
        with pytest.raises(ValueError, match="appears twice|duplicate"):
            CPUAdam([w, w])
    opt = CPUAdam([torch.nn.Parameter(torch.zeros(3))])
    with pytest.raises(ValueError, match="CPU memory, but one is on meta"):
        opt.add_param_group({"params": [torch.nn.Parameter(torch.zeros(3, device="meta"))]})
    emb = torch.nn.Embedding(10, 3, sparse=True)
    opt = CPUAdam(emb.parameters())
    emb(torch.tensor([1, 2])).sum().backward()
    with pytest.raises(RuntimeError, match="sparse gradients: use torch.optim.SparseAdam"):
        opt.step()


# --- many params: one kernel call per group (adam_step_multi_)


def many_params(seed=0):
    """50 small params of odd sizes and shapes (one transposed, so not contiguous) and a big one
    (> 2 threads x 32768 elements: a thread's range spans several params)."""
    gen = torch.Generator().manual_seed(seed)
    shapes = [(int(torch.randint(1, 300, (1,), generator=gen)),) for _ in range(48)] + [(7, 9), (1,), (70_001,)]
    ps = [torch.nn.Parameter(torch.randn(s, generator=gen)) for s in shapes]
    ps[49] = torch.nn.Parameter(torch.randn(9, 7, generator=gen).t())
    return ps


def step_all(params, step, gen, step_index):
    """Random grads, then step(); every third param skips every other step (no grad), so step
    counts differ from param to param."""
    for i, p in enumerate(params):
        skip = i % 3 == 0 and step_index % 2 == 1
        p.grad = None if skip else torch.randn(p.shape, generator=gen).to(p.dtype)
    step()


def per_param_reference(kernel, params, state, group, threads):
    """CPUAdam.step as it was: one adam_step_ call per param."""
    for p in params:
        if p.grad is None:
            continue
        s = state.setdefault(p, {})
        if not s:
            s["step"] = torch.tensor(0.0)
            s["exp_avg"], s["exp_avg_sq"] = torch.zeros(p.shape), torch.zeros(p.shape)
        s["step"] += 1
        target = p.detach().contiguous()
        kernel.adam_step_(target, p.grad.contiguous(), s["exp_avg"], s["exp_avg_sq"], None, None, group["lr"],
                          *group["betas"], group["eps"], group["weight_decay"], int(s["step"]), True, True, False, 1.0,
                          False, threads)
        with torch.no_grad():
            p.copy_(target)


@pytest.mark.parametrize("name", VARIANTS)
def test_many_params_match_torch_and_the_per_param_kernel(name):
    ours, theirs, old = many_params(), many_params(), many_params()
    kw = {"lr": 1e-2, "weight_decay": 0.1}
    opt, ref = CPUAdam(ours, ext_name=name, **kw), torch.optim.AdamW(theirs, **kw)
    old_state = {}
    g1, g2, g3 = (torch.Generator().manual_seed(5) for _ in range(3))
    for i in range(6):
        step_all(ours, opt.step, g1, i)
        step_all(theirs, ref.step, g2, i)
        step_all(old, lambda: per_param_reference(opt.kernel, old, old_state, opt.param_groups[0],
                                                  torch.get_num_threads()), g3, i)
    for a, b, c in zip(ours, theirs, old):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
        assert torch.equal(a, c)  # bit for bit what adam_step_ param by param gives
        assert opt.state[a]["step"].dtype == torch.float32
        assert float(opt.state[a]["step"]) == float(ref.state[b]["step"]) == float(old_state[c]["step"])
        assert torch.equal(opt.state[a]["exp_avg"], old_state[c]["exp_avg"])
    assert {float(opt.state[p]["step"]) for p in ours} == {3.0, 6.0}


def test_states_loaded_in_the_param_dtype_a_step_loaded_as_a_number():
    """torch's load_state_dict casts the states to the param's dtype (bf16 here); old
    checkpoints hold the step as a number. Both are converted at the next step."""
    m = model().to(torch.bfloat16)
    ref = torch.optim.AdamW(m.parameters(), lr=1e-2)
    x = torch.randn(4, 13).to(torch.bfloat16)
    m(x).float().sum().backward()
    ref.step()
    opt = CPUAdam(m.parameters(), lr=1e-2)
    opt.load_state_dict(copy.deepcopy(ref.state_dict()))
    first = next(m.parameters())
    assert opt.state[first]["exp_avg"].dtype == torch.bfloat16
    opt.state[first]["step"] = 1  # as a number
    opt.step()
    for p in m.parameters():
        s = opt.state[p]
        assert s["exp_avg"].dtype == s["exp_avg_sq"].dtype == torch.float32
        assert s["step"].dtype == torch.float32 and float(s["step"]) == 2.0


def test_amsgrad_switched_on_later():
    ours, theirs = model(), model()
    opt = CPUAdam(ours.parameters(), lr=1e-2)
    ref = torch.optim.AdamW(theirs.parameters(), lr=1e-2, weight_decay=0.0)
    train(ours, opt, 2)
    train(theirs, ref, 2)
    opt.param_groups[0]["amsgrad"] = True
    for p in theirs.parameters():  # torch.optim wants the state there: it starts at zero, as ours does
        ref.state[p]["max_exp_avg_sq"] = torch.zeros_like(p)
    ref.param_groups[0]["amsgrad"] = True
    train(ours, opt, 3, seed=2)
    train(theirs, ref, 3, seed=2)
    assert all(opt.state[p]["max_exp_avg_sq"].dtype == torch.float32 for p in ours.parameters())
    assert_same_params(ours, theirs)


def test_copies_for_some_params_only():
    m = model()
    opt = CPUAdam(m.parameters(), lr=1e-2)
    params = list(m.parameters())
    copies = [torch.empty_like(p, dtype=torch.bfloat16) if i % 2 else None for i, p in enumerate(params)]
    m(torch.randn(4, 13)).sum().backward()
    opt.step(fp16_param_groups=[copies])
    opt.step(fp16_param_groups=[copies])
    for p, c in zip(params, copies):
        assert float(opt.state[p]["step"]) == 2.0
        if c is not None:
            assert torch.equal(c, p.detach().to(torch.bfloat16))


def test_a_state_that_cannot_be_converted_is_a_clear_error_and_nothing_moves():
    m = model()
    opt = CPUAdam(m.parameters(), lr=1e-2)
    train(m, opt, 1)
    params = list(m.parameters())
    opt.state[params[2]]["exp_avg"] = torch.zeros(3)  # the wrong size
    before = [p.detach().clone() for p in params]
    with pytest.raises(RuntimeError, match=r"exp_avgs\[2\] must have as many elements as params\[2\]"):
        train(m, opt, 1)
    assert all(torch.equal(p, q) for p, q in zip(params, before))
    assert all(float(opt.state[p]["step"]) == 1.0 for p in params)


@given(st.data())
def test_fuzz_against_torch_optim(data):
    """Any params (shapes, empty ones, some without a grad at some steps), hyperparameters and
    variant: the same params as torch.optim.Adam / AdamW after a few steps."""
    name = data.draw(st.sampled_from(VARIANTS), label="variant")
    shapes = data.draw(st.lists(st.lists(st.integers(0, 9), max_size=3), min_size=1, max_size=4), label="shapes")
    kw = dict(lr=data.draw(st.floats(1e-4, 0.1), label="lr"),
              betas=(data.draw(st.floats(0.0, 0.95), label="beta1"), data.draw(st.floats(0.5, 0.9999), label="beta2")),
              eps=data.draw(st.floats(1e-10, 1e-4), label="eps"),
              weight_decay=data.draw(st.sampled_from([0.0, 0.05]), label="weight_decay"),
              amsgrad=data.draw(st.booleans(), label="amsgrad"), maximize=data.draw(st.booleans(), label="maximize"))
    adamw = data.draw(st.booleans(), label="adamw")
    seed = data.draw(st.integers(0, 2**16), label="seed")
    gen = torch.Generator().manual_seed(seed)
    ours = [torch.randn(s, generator=gen).requires_grad_() for s in shapes]
    theirs = [p.detach().clone().requires_grad_() for p in ours]
    opt = CPUAdam(ours, adamw_mode=adamw, ext_name=name, **kw)
    ref = (torch.optim.AdamW if adamw else torch.optim.Adam)(theirs, **kw)
    for _ in range(3):
        for p, q in zip(ours, theirs):
            skip = bool(torch.rand((), generator=gen) < 0.2)  # no grad this step: left alone by both
            g = None if skip else torch.randn(p.shape, generator=gen)
            p.grad, q.grad = g, None if g is None else g.clone()
        opt.step()
        ref.step()
    for p, q in zip(ours, theirs):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_deepspeeds_positional_order_is_named_not_a_tuple_comparison():
    params = [torch.nn.Parameter(torch.zeros(3))]
    with pytest.raises(TypeError, match=r"DeepSpeedCPUAdam's \(model_params, lr, bias_correction, betas.*"
                                        r"CPUAdam\(params, lr=1e-3, bias_correction=True, betas=\(0.9, 0.999\)"):
        CPUAdam(params, 1e-3, True, (0.9, 0.999))
    with pytest.raises(TypeError, match="betas must be a pair of floats"):
        CPUAdam(params, betas=0.9)
    CPUAdam(params, lr=1e-3, bias_correction=True, betas=(0.9, 0.999))  # the keyword form works


# -- the step wrapper: torch's semantics (hooks, the profiler's range), at a lower cost ---------------


def _hook_log(opt_cls, fast_path: bool, monkeypatch):
    """What the hooks of an optimizer see over two steps, with every kind of step hook registered."""
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    from opforge.optim import step_hooks

    if not fast_path:  # as on a torch without the private names: every step through torch's wrapper
        monkeypatch.setattr(step_hooks, "FACTS", None)
    m = model()
    opt = opt_cls(m.parameters(), lr=1e-2)
    log = []
    handles = [
        opt.register_step_pre_hook(lambda o, a, k: log.append(("pre", type(o).__name__, a[1:], dict(k)))),
        opt.register_step_post_hook(lambda o, a, k: log.append(("post", type(o).__name__))),
        register_optimizer_step_pre_hook(lambda o, a, k: log.append(("global pre",))),
        register_optimizer_step_post_hook(lambda o, a, k: log.append(("global post",))),
    ]
    try:
        train(m, opt, 1)
        for h in handles[2:]:
            h.remove()
        train(m, opt, 1)
        handles[0].remove()
        handles[1].remove()
        train(m, opt, 1)  # no hook left: the fast path, if there is one
    finally:
        for h in handles:
            h.remove()
    return [(e[0], *e[2:]) if e[0] == "pre" else e[:1] for e in log]


@pytest.mark.parametrize("fast_path", [True, False], ids=["fast_path", "torch_wrapper_only"])
def test_step_hooks_run_as_on_torch_optimizers(fast_path, monkeypatch):
    assert _hook_log(CPUAdam, fast_path, monkeypatch) == _hook_log(torch.optim.AdamW, fast_path, monkeypatch)


def test_a_pre_hook_can_rewrite_the_steps_arguments():
    m = model()
    opt = CPUAdam(m.parameters(), lr=1e-2)
    seen = []
    opt.register_step_pre_hook(lambda o, a, k: ((a[0],), {"closure": lambda: seen.append("closure") or 0.0}))
    train(m, opt, 1)
    assert seen == ["closure"]


def test_the_profiler_sees_the_step_as_on_torch_optimizers():
    m = model()
    opt = CPUAdam(m.parameters(), lr=1e-2)
    train(m, opt, 1)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        train(m, opt, 1)
    names = {e.name for e in prof.events()}
    assert "Optimizer.step#CPUAdam.step" in names


def test_the_step_is_not_wrapped_twice():
    CPUAdam(model().parameters())
    CPUAdam(model().parameters())
    assert CPUAdam.step.hooked and not hasattr(CPUAdam.step.__wrapped__, "hooked")


def test_a_compiled_step_runs_the_kernel_eagerly_and_matches_torch():
    """torch.compile(opt.step), as torch's "compiling the optimizer" recipe does, and a compiled training step
    that calls it: the step runs as it is (dynamo skips it; tracing would hand the C++ kernel fake tensors), its
    hooks included, and trains as torch.optim.AdamW does."""
    ours, theirs, whole = model(), model(), model()
    kw = dict(lr=1e-2, weight_decay=0.05)
    opt, ref, opt2 = CPUAdam(ours.parameters(), **kw), torch.optim.AdamW(theirs.parameters(), **kw), \
        CPUAdam(whole.parameters(), **kw)
    seen = []
    handle = opt.register_step_post_hook(lambda o, a, k: seen.append("post"))
    step = torch.compile(opt.step)

    def train_step(x):
        opt2.zero_grad()
        whole(x).pow(2).mean().backward()
        opt2.step()

    compiled_train = torch.compile(train_step)
    gen = torch.Generator().manual_seed(4)
    torch.compiler.reset()
    try:
        for _ in range(3):
            x = torch.randn(16, 13, generator=gen)
            for m, o in ((ours, opt), (theirs, ref)):
                o.zero_grad()
                m(x).pow(2).mean().backward()
            step()
            ref.step()
            compiled_train(x)
    finally:
        handle.remove()
        torch.compiler.reset()
    assert seen == ["post"] * 3
    assert_same_params(ours, theirs)
    assert_same_params(whole, theirs)
