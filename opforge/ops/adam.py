"""``opforge::adam_step_`` and ``opforge::adam_step_multi_``: one Adam/AdamW step, in place,
on the best ``cpu_adam`` kernel; the second for a whole list of params in one call.

Mutating custom ops (param, exp_avg, exp_avg_sq, max_exp_avg_sq and param_copy are written;
the multi op also writes each param's step count), so torch.compile and functionalisation see
what they change. ``CPUAdam`` calls the kernel directly (it may be pinned to one variant);
these ops are for code that wants the step inside a compiled graph.
"""

from __future__ import annotations

import torch

from ..kernels.cpu_adam import CPUAdamLoader


@torch.library.custom_op("opforge::adam_step_",
                         mutates_args=("param", "exp_avg", "exp_avg_sq", "max_exp_avg_sq", "param_copy"),
                         device_types="cpu")
def adam_step_(param: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor,
               max_exp_avg_sq: torch.Tensor | None, param_copy: torch.Tensor | None, lr: float, beta1: float,
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


@torch.library.custom_op("opforge::adam_step_multi_",
                         mutates_args=("params", "exp_avgs", "exp_avg_sqs", "max_exp_avg_sqs", "param_copies", "steps"),
                         device_types="cpu")
def adam_step_multi_(params: list[torch.Tensor], grads: list[torch.Tensor], exp_avgs: list[torch.Tensor],
                     exp_avg_sqs: list[torch.Tensor], max_exp_avg_sqs: list[torch.Tensor],
                     param_copies: list[torch.Tensor], steps: list[torch.Tensor], lr: float, beta1: float,
                     beta2: float, eps: float, weight_decay: float, adamw: bool, bias_correction: bool,
                     maximize: bool, grad_scale: float) -> None:
    """``adam_step_`` on every param of the lists in one call. ``steps``: each param's
    ``state["step"]`` (a one-element fp32 tensor), incremented by 1 and used as its step.
    ``max_exp_avg_sqs`` non-empty: amsgrad. ``param_copies`` non-empty: one copy per param."""
    CPUAdamLoader().load().adam_step_multi_(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, param_copies,
                                            steps, lr, beta1, beta2, eps, weight_decay, adamw, bias_correction,
                                            maximize, grad_scale, False, torch.get_num_threads())


@adam_step_multi_.register_fake
def _(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, param_copies, steps, lr, beta1, beta2, eps,
      weight_decay, adamw, bias_correction, maximize, grad_scale) -> None:
    n = len(params)
    lists = {"grads": grads, "exp_avgs": exp_avgs, "exp_avg_sqs": exp_avg_sqs, "steps": steps,
             "max_exp_avg_sqs": max_exp_avg_sqs or [None] * n, "param_copies": param_copies or [None] * n}
    for name, got in lists.items():
        if len(got) != n:
            raise RuntimeError(f"adam_step_multi_: {name} must have one tensor per param ({n} params), got {len(got)}")
    for i, (param, grad) in enumerate(zip(params, grads)):
        if grad.shape != param.shape:
            raise RuntimeError(f"adam_step_multi_: grads[{i}] shape {list(grad.shape)} differs from params[{i}] "
                               f"shape {list(param.shape)}")
