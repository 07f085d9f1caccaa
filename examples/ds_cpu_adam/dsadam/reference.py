"""DeepSpeed's CPU Adam functions (``create_adam``, ``adam_update``, ``destroy_adam``) in pure torch:
the fallback that runs where nothing can be built, and the reference the tests compare with.

The update is DeepSpeed's (csrc/includes/cpu_adam.h): decoupled weight decay (AdamW) or L2
(Adam), bias correction folded into the step size and the denominator, in fp32."""

from __future__ import annotations

import math

import torch

_OPTIMIZERS: dict[int, dict] = {}


def create_adam(optimizer_id: int, alpha: float = 1e-3, betta1: float = 0.9, betta2: float = 0.999,
                eps: float = 1e-8, weight_decay: float = 0.0, adamw_mode: bool = True, should_log: bool = False) -> int:
    _OPTIMIZERS[optimizer_id] = {"adamw_mode": bool(adamw_mode)}
    return 0


def destroy_adam(optimizer_id: int) -> int:
    _OPTIMIZERS.pop(optimizer_id, None)
    return 0


def adam_update(optimizer_id: int, step: int, lr: float, beta1: float, beta2: float, epsilon: float,
                weight_decay: float, bias_correction: bool, params: torch.Tensor, grads: torch.Tensor,
                exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor) -> int:
    if optimizer_id not in _OPTIMIZERS:
        raise RuntimeError(f"optimizer {optimizer_id} was not created: call create_adam first")
    adamw = _OPTIMIZERS[optimizer_id]["adamw_mode"]
    bc1 = 1 - beta1**step if bias_correction else 1.0
    bc2 = math.sqrt(1 - beta2**step) if bias_correction else 1.0
    p, g = params.float(), grads.float()
    if weight_decay > 0 and not adamw:
        g = g + weight_decay * p
    m = exp_avg.float().mul_(beta1).add_(g, alpha=1 - beta1)
    v = exp_avg_sq.float().mul_(beta2).addcmul_(g, g, value=1 - beta2)
    denom = v.sqrt() / bc2 + epsilon
    if weight_decay > 0 and adamw:
        p = p * (1 - lr * weight_decay)
    p = p - (lr / bc1) * m / denom
    params.copy_(p)
    exp_avg.copy_(m)
    exp_avg_sq.copy_(v)
    return 0
