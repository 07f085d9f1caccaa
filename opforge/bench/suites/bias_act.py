"""Fused bias + activation, StyleGAN2's case: ``y = clamp(lrelu(x + b, 0.2) * sqrt(2), -256, 256)``,
``b`` along dim 1 of an NCHW tensor; forward (``fwd``) and forward + backward (``fwd+bwd``).

Implementations: ``torch eager`` (the baseline: ``F.leaky_relu(x + b.view(1, -1, 1, 1), 0.2)
* gain`` then ``clamp``, what a PyTorch user writes), ``torch.compile`` of that same function
(compiled afresh for each case, ``dynamic=False``; the compile is its untimed first call; left
out with ``Options.compile`` off, the default of ``--quick``) and
``opforge`` (``opforge.ops.bias_act``, with its dispatch and checks in the time). fwd+bwd:
``x`` and ``b`` require grad and one call is ``y = f(x, b); y.backward(dy)``. Checked: y (fwd),
or x's and b's gradients (fwd+bwd), against eager's.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
import torch.nn.functional as F

from ..model import OPFORGE, PEER, Case, Impl, Missing, Options
from .base import SHORT, TOLERANCE, Suite, numel_label

ALPHA, GAIN, CLAMP = 0.2, math.sqrt(2), 256.0
#: (device type, quick) -> (shapes, dtypes)
SIZES = {
    ("cpu", True): (((8, 64, 64, 64),), (torch.float32,)),
    ("cpu", False): (((16, 64, 32, 32), (32, 128, 64, 64)), (torch.float32, torch.bfloat16)),
    ("cuda", True): (((16, 64, 32, 32), (32, 512, 32, 32)), (torch.float16,)),
    ("cuda", False): (((16, 64, 32, 32), (64, 256, 64, 64)), (torch.float32, torch.float16, torch.bfloat16)),
}


def eager(x: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (F.leaky_relu(x + b.view(1, -1, 1, 1), ALPHA) * GAIN).clamp(-CLAMP, CLAMP)


def compiled():
    """torch.compile of ``eager``, fresh (no graphs kept from another shape)."""
    torch.compiler.reset()
    return torch.compile(eager, dynamic=False)


def opforge_fn(x: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    from ...ops import bias_act

    return bias_act(x, b, dim=1, act="lrelu", alpha=ALPHA, gain=GAIN, clamp=CLAMP)


class BiasActSuite(Suite):
    kind = "bias_act"

    def __init__(self, device: torch.device, options: Options):
        super().__init__(device, options)
        from ...kernels.bias_act import BiasActLoader

        self.variant = BiasActLoader().load(device=device.type).name

    def missing(self) -> list[Missing]:
        if self.options.compile:
            return []
        return [Missing("torch.compile", "left out (--no-compile, the default with --quick): its first compile "
                                         "takes tens of seconds on a small CPU; run with --compile to include it")]

    def cases(self) -> Iterator[Case]:
        shapes, dtypes = SIZES[(self.device.type, self.quick)]
        for dtype in dtypes:
            for shape in shapes:
                yield from self.shape_cases(shape, dtype)

    def shape_cases(self, shape: tuple[int, ...], dtype: torch.dtype) -> Iterator[Case]:
        g = torch.Generator(device=self.device).manual_seed(0)
        x = torch.randn(shape, device=self.device, dtype=dtype, generator=g)
        b = (0.1 * torch.randn(shape[1], device=self.device, generator=g)).to(dtype)
        dy = torch.randn(shape, device=self.device, dtype=dtype, generator=g)
        params = {"shape": list(shape), "numel": x.numel(), "dtype": SHORT[dtype], "act": "lrelu", "alpha": ALPHA,
                  "gain": GAIN, "clamp": CLAMP}
        label = f"{numel_label(shape)} {SHORT[dtype]}"
        fns = {"torch eager": (PEER, eager), "opforge": (OPFORGE, opforge_fn)}
        if self.options.compile:
            fns = {"torch eager": (PEER, eager), "torch.compile": (PEER, compiled()), "opforge": (OPFORGE, opforge_fn)}
        yield Case("fwd", label, params, tuple(Impl(n, r, forward(f, x, b)) for n, (r, f) in fns.items()),
                   "torch eager", TOLERANCE[dtype])
        if self.options.compile:
            fns["torch.compile"] = (PEER, compiled())  # a graph with autograd, not the no-grad one
        xg, bg = x.detach().requires_grad_(), b.detach().requires_grad_()
        impls = tuple(Impl(n, r, backward(f, xg, bg, dy), output=lambda: (xg.grad, bg.grad))
                      for n, (r, f) in fns.items())
        yield Case("fwd+bwd", label, params, impls, "torch eager", TOLERANCE[dtype])


def forward(f, x, b):
    def call():
        with torch.no_grad():
            return f(x, b)
    return call


def backward(f, x, b, dy):
    def call():
        x.grad = b.grad = None
        f(x, b).backward(dy)
    return call
