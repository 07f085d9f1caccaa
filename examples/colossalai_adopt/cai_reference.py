"""ColossalAI's CPU Adam module API (``CPUAdamOptimizer(lr, beta1, beta2, eps, weight_decay, adamw_mode)``
and its ``step(...)``) in pure torch: the fallback where its C++ can't be built, and a reference.
The update follows its ``cpu_adam.cpp``: gradients divided by ``loss_scale`` when it is positive,
decoupled weight decay (AdamW) or L2, bias correction, all in fp32."""

from __future__ import annotations

import math

import torch


class CPUAdamOptimizer:
    def __init__(self, lr: float, beta1: float, beta2: float, eps: float, weight_decay: float, adamw_mode: bool):
        self.adamw_mode = bool(adamw_mode)

    def step(self, step: int, lr: float, beta1: float, beta2: float, eps: float, weight_decay: float,
             bias_correction: bool, params: torch.Tensor, grads: torch.Tensor, exp_avg: torch.Tensor,
             exp_avg_sq: torch.Tensor, loss_scale: float = -1.0) -> None:
        p, g = params.float(), grads.float()
        if loss_scale > 0:
            g = g / loss_scale
        if weight_decay > 0 and not self.adamw_mode:
            g = g + weight_decay * p
        m = exp_avg.float().mul_(beta1).add_(g, alpha=1 - beta1)
        v = exp_avg_sq.float().mul_(beta2).addcmul_(g, g, value=1 - beta2)
        bc1 = 1 - beta1**step if bias_correction else 1.0
        bc2 = math.sqrt(1 - beta2**step) if bias_correction else 1.0
        if weight_decay > 0 and self.adamw_mode:
            p = p * (1 - lr * weight_decay)
        params.copy_(p - (lr / bc1) * m / (v.sqrt() / bc2 + eps))
        exp_avg.copy_(m)
        exp_avg_sq.copy_(v)
