"""``opforge::adam_step_``: one Adam/AdamW step, in place, on the best ``cpu_adam`` kernel.

A mutating custom op (param, exp_avg, exp_avg_sq, max_exp_avg_sq and param_copy are
written), so torch.compile and functionalisation see what it changes. ``CPUAdam`` calls the
kernel directly (it may be pinned to one variant); this op is for code that wants the step
inside a compiled graph.
"""

from __future__ import annotations

from typing import Optional

import torch

from ..kernels.cpu_adam import CPUAdamLoader


@torch.library.custom_op("opforge::adam_step_",
                         mutates_args=("param", "exp_avg", "exp_avg_sq", "max_exp_avg_sq", "param_copy"),
                         device_types="cpu")
def adam_step_(param: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor,
               max_exp_avg_sq: Optional[torch.Tensor], param_copy: Optional[torch.Tensor], lr: float, beta1: float,
               beta2: float, eps: float, weight_decay: float, step: int, adamw: bool, bias_correction: bool,
               maximize: bool, grad_scale: float) -> None:
    """``max_exp_avg_sq`` given: amsgrad. ``param_copy`` given: the updated param is also
    written there in its dtype. ``grad_scale``: the grads are divided by it first."""
    CPUAdamLoader().load().adam_step_(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, param_copy, lr, beta1, beta2,
                                      eps, weight_decay, step, adamw, bias_correction, maximize, grad_scale, False,
                                      torch.get_num_threads())


@adam_step_.register_fake
def _(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, param_copy, lr, beta1, beta2, eps, weight_decay, step, adamw,
      bias_correction, maximize, grad_scale) -> None:
    if grad.shape != param.shape:
        raise RuntimeError(f"adam_step_: grad shape {list(grad.shape)} differs from param shape {list(param.shape)}")
    return None
