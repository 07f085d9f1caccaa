"""CPU Adam: one ``optimizer.step()`` over one fp32 parameter of N elements, AdamW.

Implementations: ``torch AdamW`` (torch's default on the CPU, the single-tensor loop),
``torch AdamW fused`` (``fused=True``, the baseline: torch's fastest), ``DeepSpeedCPUAdam``
when DeepSpeed is installed (its op is built before any timing), and ``opforge CPUAdam``
(the loader's best variant). Each updates its own copy of the same parameter and gradient
(lr 1e-3, betas 0.9/0.999, eps 1e-8, weight decay 0.01). Checked: the parameter after the
first step, against torch fused's.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

import torch

from ..model import OPFORGE, PEER, Case, Impl, Missing, Options
from .base import Suite, elements

LR, BETAS, EPS, WD = 1e-3, (0.9, 0.999), 1e-8, 0.01
QUICK_SIZES = (1_000_000,)
FULL_SIZES = (1_000_000, 10_000_000, 50_000_000)
BASELINE = "torch AdamW fused"


def deepspeed_adam() -> tuple[type | None, str]:
    """DeepSpeed's CPU Adam class, or None and why not."""
    try:
        with contextlib.redirect_stdout(sys.stderr):  # it logs at import
            from deepspeed.ops.adam import DeepSpeedCPUAdam
    except ImportError as exc:
        return None, f"deepspeed is not installed ({exc}); pip install deepspeed to compare with it"
    except Exception as exc:  # noqa: BLE001 - a broken install: reported, the bench goes on
        return None, f"deepspeed failed to import: {type(exc).__name__}: {exc}"
    return DeepSpeedCPUAdam, ""


class CPUAdamSuite(Suite):
    kind = "cpu_adam"
    devices = ("cpu",)

    def __init__(self, device: torch.device, options: Options):
        super().__init__(device, options)
        from ...kernel_loader import CPUAdamLoader

        self.variant = CPUAdamLoader().load().name
        self._deepspeed, self._deepspeed_why = deepspeed_adam()

    def missing(self) -> list[Missing]:
        return [Missing("DeepSpeedCPUAdam", self._deepspeed_why)] if self._deepspeed is None else []

    def optimizers(self) -> dict[str, tuple[str, object]]:
        from ...optim import CPUAdam

        kw = {"lr": LR, "betas": BETAS, "eps": EPS, "weight_decay": WD}
        out = {
            "torch AdamW": (PEER, lambda p: torch.optim.AdamW([p], **kw)),
            BASELINE: (PEER, lambda p: torch.optim.AdamW([p], fused=True, **kw)),
        }
        if self._deepspeed is not None:
            ds = self._deepspeed
            out["DeepSpeedCPUAdam"] = (PEER, lambda p: ds([p], adamw_mode=True, **kw))
        out["opforge CPUAdam"] = (OPFORGE, lambda p: CPUAdam([p], adamw_mode=True, **kw))
        return out

    def cases(self) -> Iterator[Case]:
        for n in QUICK_SIZES if self.quick else FULL_SIZES:
            g = torch.Generator().manual_seed(0)
            param, grad = torch.randn(n, generator=g), torch.randn(n, generator=g) * 1e-2
            impls = []
            for name, (role, make) in self.optimizers().items():
                p = torch.nn.Parameter(param.clone())
                p.grad = grad.clone()
                with contextlib.redirect_stdout(sys.stderr):  # DeepSpeed prints a line per optimizer
                    opt = make(p)
                impls.append(Impl(name, role, opt.step, output=p.detach))
            yield Case("step", f"{elements(n)} fp32", {"numel": n, "dtype": "fp32"}, tuple(impls), BASELINE,
                       tol=1e-5)
