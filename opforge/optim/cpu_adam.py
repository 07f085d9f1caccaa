"""``CPUAdam``: Adam/AdamW for parameters in CPU memory (ZeRO-Offload style), on the fastest
``cpu_adam`` kernel for this CPU (``CPUAdamLoader``).

* A ``torch.optim.Optimizer``: param groups, lr schedulers, closures.
* ``state_dict()`` has torch.optim.Adam/AdamW's layout (``step``, ``exp_avg``,
  ``exp_avg_sq``, ``max_exp_avg_sq``), so a checkpoint moves to torch's optimizers and back.
  States are kept in fp32 whatever the param dtype (states loaded in another dtype are
  converted at the next step).
* DeepSpeedCPUAdam's argument names are accepted (``model_params``,
  ``fp32_optimizer_states``, ``step(fp16_param_groups=...)``), so it is a drop-in.
* ``torch.amp.GradScaler``: the step unscales and skips on inf/NaN itself
  (``_step_supports_amp_scaling``), as torch's fused optimizers do.
* One kernel call per param group (``adam_step_multi_``): the params of a group are
  updated in one parallel region, each at its own step count.
"""

from __future__ import annotations

import torch

from ..kernels.cpu_adam import CPUAdamLoader
from .step_hooks import lean_step


def _by_copy(lists: list) -> list:
    """adam_step_multi_'s lists (params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, copies,
    steps) as one call's, or as two when only some params have a copy (None in fp16_param_groups)."""
    copies = lists[5]
    if not any(c is None for c in copies):
        return [lists]
    calls = []
    for with_copy in (True, False):
        keep = [(c is not None) == with_copy for c in copies]
        calls.append([[x for x, k in zip(xs, keep) if k] if xs else xs for xs in lists])
    calls[1][5] = []
    return calls


_DEEPSPEED_ORDER = ("CPUAdam takes torch.optim.Adam's positional order (params, lr, betas, eps, weight_decay, "
                    "adamw_mode, ...), and this call looks like DeepSpeedCPUAdam's (model_params, lr, bias_correction, "
                    "betas, eps, weight_decay, amsgrad, adamw_mode). Pass them by keyword, which both accept: "
                    "CPUAdam(params, lr=1e-3, bias_correction=True, betas=(0.9, 0.999), eps=1e-8)")


def _check_order(betas, eps) -> None:
    """A bool where ``betas`` goes, or a pair where ``eps`` goes: DeepSpeed's positional order."""
    if isinstance(betas, bool) or isinstance(eps, (tuple, list)):
        raise TypeError(f"{_DEEPSPEED_ORDER} (got betas={betas!r}, eps={eps!r})")
    if not (isinstance(betas, (tuple, list)) and len(betas) == 2):
        raise TypeError(f"betas must be a pair of floats, e.g. (0.9, 0.999), not {betas!r}")


class CPUAdam(torch.optim.Optimizer):
    _step_supports_amp_scaling = True

    def __init__(self, params=None, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, adamw_mode=True,
                 bias_correction=True, amsgrad=False, maximize=False, *, model_params=None,
                 fp32_optimizer_states=True, ext_name=None):
        if params is None:
            params = model_params  # DeepSpeedCPUAdam's name
        if params is None:
            raise TypeError("CPUAdam needs the parameters to optimise: CPUAdam(model.parameters(), lr=...)")
        _check_order(betas, eps)
        if not fp32_optimizer_states:
            raise ValueError("fp32_optimizer_states=False is not supported: CPUAdam keeps Adam's states in fp32 "
                             "(low-precision params are fine); drop the argument")
        if not 0.0 <= lr:
            raise ValueError(f"invalid learning rate {lr}: must be >= 0")
        if not 0.0 <= eps:
            raise ValueError(f"invalid eps {eps}: must be >= 0")
        if not (0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0):
            raise ValueError(f"invalid betas {betas}: each must be in [0, 1)")
        if not 0.0 <= weight_decay:
            raise ValueError(f"invalid weight_decay {weight_decay}: must be >= 0")
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad, maximize=maximize,
                        adamw_mode=adamw_mode, bias_correction=bias_correction)
        super().__init__(params, defaults)
        self.kernel = CPUAdamLoader().load(ext_name=ext_name)

    def add_param_group(self, param_group: dict) -> None:
        super().add_param_group(param_group)
        params = self.param_groups[-1]["params"]
        for p in params:
            self._check_param(p)
        if len({id(p) for p in params}) != len(params):  # torch only warns; one kernel call would step it twice
            raise ValueError("CPUAdam: a parameter appears twice in one param group; pass each parameter once "
                             "(e.g. list(dict.fromkeys(params)))")

    @staticmethod
    def _check_param(p: torch.Tensor) -> None:
        if p.device.type != "cpu":
            raise ValueError(f"CPUAdam holds parameters in CPU memory, but one is on {p.device}: keep the "
                             "optimiser's params on the CPU (ZeRO-Offload), or use torch.optim.AdamW(fused=True) "
                             "for GPU params")
        if p.dtype not in (torch.float32, torch.bfloat16, torch.float16):
            raise ValueError(f"CPUAdam updates float32, bfloat16 and float16 params, not {p.dtype}")

    def __setstate__(self, state):
        super().__setstate__(state)
        for group in self.param_groups:  # groups saved by torch.optim.Adam/AdamW lack our two keys
            # torch.optim.Adam records decoupled_weight_decay (torch >= 2.8): AdamW's is True.
            group.setdefault("adamw_mode", group.get("decoupled_weight_decay", self.defaults.get("adamw_mode", True)))
            group.setdefault("bias_correction", True)
            group.setdefault("amsgrad", False)
            group.setdefault("maximize", False)

    def _state(self, p: torch.Tensor, amsgrad: bool) -> dict:
        state = self.state[p]
        if not state:
            state["step"] = torch.tensor(0.0, dtype=torch.float32)
            state["exp_avg"] = torch.zeros_like(p, dtype=torch.float32, memory_format=torch.contiguous_format)
            state["exp_avg_sq"] = torch.zeros_like(p, dtype=torch.float32, memory_format=torch.contiguous_format)
        keys = ["exp_avg", "exp_avg_sq"] + (["max_exp_avg_sq"] if amsgrad else [])
        for key in keys:  # loaded from torch.optim in the param's dtype, or missing (amsgrad turned on later)
            t = state.get(key)
            if t is None:
                state[key] = torch.zeros_like(p, dtype=torch.float32, memory_format=torch.contiguous_format)
            elif t.dtype != torch.float32 or not t.is_contiguous() or t.device.type != "cpu":
                state[key] = t.to(device="cpu", dtype=torch.float32, memory_format=torch.contiguous_format)
        step = state["step"]  # a number in old checkpoints; fp64 from torch under a fp64 default dtype
        if not torch.is_tensor(step) or step.dtype != torch.float32 or step.device.type != "cpu":
            state["step"] = torch.tensor(float(step), dtype=torch.float32)
        return state

    @staticmethod
    def _check_grad(grad: torch.Tensor) -> None:
        if grad.is_sparse:
            raise RuntimeError("CPUAdam does not support sparse gradients: use torch.optim.SparseAdam")
        if grad.layout != torch.strided:
            raise RuntimeError(f"CPUAdam needs dense (strided) gradients, got one in {grad.layout}")
        if grad.device.type != "cpu":
            raise RuntimeError(f"a gradient is on {grad.device}: CPUAdam needs gradients in CPU memory")

    @lean_step
    @torch.no_grad()
    def step(self, closure=None, fp16_param_groups=None):
        """One step. ``fp16_param_groups`` (DeepSpeed's name): per group, a list of tensors that
        receive a copy of each updated param in their own dtype (e.g. bf16 weights for the GPU)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        grad_scale = getattr(self, "grad_scale", None)  # set by torch.amp.GradScaler
        found_inf = getattr(self, "found_inf", None)
        if found_inf is not None and float(found_inf) > 0:
            return loss
        scale = float(grad_scale) if grad_scale is not None else 1.0
        threads = torch.get_num_threads()
        for gi, group in enumerate(self.param_groups):
            copies = fp16_param_groups[gi] if fp16_param_groups is not None else None
            if torch.is_tensor(copies):
                copies = [copies]
            self._step_group(group, copies, scale, threads)
        return loss

    def _step_group(self, group: dict, copies, scale: float, threads: int) -> None:
        """The params of the group that have a grad, in one kernel call."""
        strided = self._steady_step(group, copies, scale, threads)
        if strided is None:  # refused: check the grads, convert the states, and call it again
            lists, strided = self._lists(group, copies, prepare=True)
            for call in _by_copy(lists):  # two calls when only some params have a copy
                self._kernel_step(group, call, scale, threads)
        for p, target in strided:  # non-contiguous params were updated in a contiguous copy
            p.copy_(target)

    def _steady_step(self, group: dict, copies, scale: float, threads: int) -> list | None:
        """The kernel checks every tensor before it writes any, so the steady state hands it the
        states as they are. None when it refused (nothing written): a state loaded in another
        dtype or layout, a step loaded as a number, a bad grad, copies for only some params."""
        try:
            lists, strided = self._lists(group, copies, prepare=False)
            self._kernel_step(group, lists, scale, threads)
        except RuntimeError:
            return None
        return strided

    def _lists(self, group: dict, copies, prepare: bool) -> tuple[list, list]:
        """adam_step_multi_'s lists for the params of the group that have a grad, and the
        non-contiguous params with the contiguous copy of each that the lists hold.
        ``prepare``: check each grad and bring each state to the kernel's form (fp32, contiguous,
        a fp32 step tensor); otherwise only states that are missing are made."""
        amsgrad = group["amsgrad"]
        lists = [[] for _ in range(7)]
        params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, outs, steps = lists
        strided = []
        states = self.state
        for pi, p in enumerate(group["params"]):
            grad = p.grad
            if grad is None:
                continue
            if prepare:
                self._check_grad(grad)
            state = states.get(p)
            if prepare or not state or (amsgrad and "max_exp_avg_sq" not in state):
                state = self._state(p, amsgrad)
            if not p.is_contiguous():
                strided.append((p, p.contiguous()))
                p = strided[-1][1]
            params.append(p)
            grads.append(grad if grad.is_contiguous() else grad.contiguous())
            exp_avgs.append(state["exp_avg"])
            exp_avg_sqs.append(state["exp_avg_sq"])
            steps.append(state["step"])
            if amsgrad:
                max_exp_avg_sqs.append(state["max_exp_avg_sq"])
            if copies is not None:
                outs.append(copies[pi])
        return lists, strided

    def _kernel_step(self, group: dict, lists: list, scale: float, threads: int) -> None:
        if lists[0]:
            op = self.kernel.ops.adam_step_multi_
            op = getattr(op, "default", op)  # a C++ op's overload, called directly: 1 us less than its packet
            op(*lists, float(group["lr"]), *group["betas"], group["eps"], group["weight_decay"], group["adamw_mode"],
               group["bias_correction"], group["maximize"], scale, False, threads)
