"""The torch implementation of ``adam_step_``: the reference, and the fallback that always works.

Same arguments and semantics as the C++ op (``csrc/cpu_adam.cpp``). When param, grad and
states are all fp32 and no copy or found-inf check is asked for, it is torch's own fused
CPU Adam (``torch._fused_adam_``/``_fused_adamw_``, when this torch has them); otherwise
plain torch ops in fp32, written back in the param's dtype.
"""

from __future__ import annotations

import math

import torch

_FLOATS = (torch.float32, torch.bfloat16, torch.float16)


def _check(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, param_copy, step, lr, beta1, beta2, eps, weight_decay,
           grad_scale):
    for name, t in (("param", param), ("grad", grad), ("exp_avg", exp_avg), ("exp_avg_sq", exp_avg_sq)):
        if t.device.type != "cpu":
            raise RuntimeError(f"adam_step_: {name} must be a CPU tensor, got {t.device}")
        if t.layout != torch.strided:
            raise RuntimeError(f"adam_step_: {name} must be a dense tensor, got {t.layout}")
    if param.dtype not in _FLOATS or grad.dtype not in _FLOATS:
        raise RuntimeError(f"adam_step_: param and grad must be float32, bfloat16 or float16, "
                           f"got {param.dtype} and {grad.dtype}")
    if grad.shape != param.shape:
        raise RuntimeError(f"adam_step_: grad shape {list(grad.shape)} differs from param shape {list(param.shape)}")
    for name, t in (("exp_avg", exp_avg), ("exp_avg_sq", exp_avg_sq), ("max_exp_avg_sq", max_exp_avg_sq)):
        if t is not None and (t.dtype != torch.float32 or t.numel() != param.numel()):
            raise RuntimeError(f"adam_step_: {name} must be float32 with {param.numel()} elements, "
                               f"got {t.dtype} with {t.numel()}")
    if param_copy is not None and param_copy.numel() != param.numel():
        raise RuntimeError(f"adam_step_: param_copy must have {param.numel()} elements, got {param_copy.numel()}")
    if step < 1 or lr < 0 or eps < 0 or not (0 <= beta1 < 1 and 0 <= beta2 < 1):
        raise RuntimeError(f"adam_step_: need step >= 1, lr >= 0, eps >= 0 and betas in [0, 1); got step={step}, "
                           f"lr={lr}, eps={eps}, betas=({beta1}, {beta2})")
    if weight_decay < 0 or not (0 < grad_scale < math.inf):
        raise RuntimeError(f"adam_step_: need weight_decay >= 0 and a finite grad_scale > 0; got "
                           f"weight_decay={weight_decay}, grad_scale={grad_scale}")


def adam_step_(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, param_copy, lr, beta1, beta2, eps, weight_decay,
               step, adamw, bias_correction, maximize, grad_scale, check_finite, num_threads) -> bool:
    _check(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, param_copy, step, lr, beta1, beta2, eps, weight_decay,
           grad_scale)
    if param.numel() == 0:
        return True
    if check_finite and not bool(torch.isfinite(grad).all()):
        return False
    shape = param.shape
    if (hasattr(torch, "_fused_adam_") and param.dtype == grad.dtype == torch.float32 and param_copy is None
            and bias_correction and grad_scale == 1.0 and param.is_contiguous() and grad.is_contiguous()):
        fused = torch._fused_adamw_ if adamw else torch._fused_adam_
        states = [exp_avg.view(shape)], [exp_avg_sq.view(shape)]
        fused([param], [grad], *states, [max_exp_avg_sq.view(shape)] if max_exp_avg_sq is not None else [],
              [torch.tensor(float(step))], lr=lr, beta1=beta1, beta2=beta2, weight_decay=weight_decay, eps=eps,
              amsgrad=max_exp_avg_sq is not None, maximize=maximize)
        return True
    p = param.float()
    g = grad.float()
    if grad_scale != 1.0:
        g = g / grad_scale
    if maximize:
        g = -g
    if adamw:
        p.mul_(1 - lr * weight_decay)
    elif weight_decay:
        g = g.add(p, alpha=weight_decay)
    m, v = exp_avg.view(shape), exp_avg_sq.view(shape)
    m.lerp_(g, 1 - beta1)
    v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
    bc1 = 1 - beta1**step if bias_correction else 1.0
    bc2_sqrt = math.sqrt(1 - beta2**step) if bias_correction else 1.0
    d = v
    if max_exp_avg_sq is not None:
        vmax = max_exp_avg_sq.view(shape)
        torch.maximum(vmax, v, out=vmax)
        d = vmax
    p.addcdiv_(m, d.sqrt().div_(bc2_sqrt).add_(eps), value=-lr / bc1)
    if p is not param:
        param.copy_(p)
    if param_copy is not None:  # the param as stored (rounded to its dtype), as the C++ kernel writes it
        param_copy.view(shape).copy_(param)
    return True


def _check_lengths(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, param_copies, steps):
    n = len(params)
    for name, got, optional in (("grads", grads, False), ("exp_avgs", exp_avgs, False),
                                ("exp_avg_sqs", exp_avg_sqs, False), ("steps", steps, False),
                                ("max_exp_avg_sqs", max_exp_avg_sqs, True), ("param_copies", param_copies, True)):
        if len(got) != n and not (optional and not got):
            raise RuntimeError(f"adam_step_multi_: {name} must have one tensor per param ({n} params)"
                               f"{' or be empty' if optional else ''}, got {len(got)}")


def _check_step(i, t):
    if not (torch.is_tensor(t) and t.device.type == "cpu" and t.dtype == torch.float32 and t.numel() == 1):
        raise RuntimeError(f"adam_step_multi_: steps[{i}] must be a one-element float32 CPU tensor "
                           f"(torch.optim.Adam's state[\"step\"]), got {t!r}")
    if not float(t) >= 0:
        raise RuntimeError(f"adam_step_multi_: steps[{i}] must hold the number of steps taken (>= 0), got {float(t)}")


def adam_step_multi_(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, param_copies, steps, lr, beta1, beta2,
                     eps, weight_decay, adamw, bias_correction, maximize, grad_scale, check_finite,
                     num_threads) -> bool:
    """``adam_step_`` on each param of the lists, each at its own step (``steps[i]`` + 1,
    written back). Everything is checked first; with ``check_finite``, an inf/NaN in any grad
    skips the whole step (steps included) and returns False."""
    _check_lengths(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, param_copies, steps)
    vmaxs = max_exp_avg_sqs or [None] * len(params)
    copies = param_copies or [None] * len(params)
    for i, args in enumerate(zip(params, grads, exp_avgs, exp_avg_sqs, vmaxs, copies)):
        _check_step(i, steps[i])
        try:
            _check(*args, float(steps[i]) + 1, lr, beta1, beta2, eps, weight_decay, grad_scale)
        except RuntimeError as e:
            raise RuntimeError(f"adam_step_multi_: params[{i}]: {e}") from None
    if check_finite and not all(bool(torch.isfinite(g).all()) for g in grads):
        return False
    for args, step in zip(zip(params, grads, exp_avgs, exp_avg_sqs, vmaxs, copies), steps):
        step.add_(1)
        adam_step_(*args, lr, beta1, beta2, eps, weight_decay, float(step), adamw, bias_correction, maximize,
                   grad_scale, False, num_threads)
    return True


def simd_width() -> int:
    return 0
