"""``BiasAct``: a learnable bias and an activation in one op (``opforge.ops.bias_act``)."""

from __future__ import annotations

import torch

from ..ops.bias_act import _resolve, bias_act


class BiasAct(torch.nn.Module):
    """``clamp(act(x + bias) * gain, -clamp, clamp)`` with ``bias`` (``channels``, zeros at init)
    broadcast along ``dim``. ``act``, ``alpha``, ``gain`` and ``clamp`` as in ``opforge.ops.bias_act``;
    they are checked here, at construction.

    >>> m = BiasAct(4, act="lrelu")
    >>> m
    BiasAct(4, act='lrelu', alpha=0.2, gain=1.414, dim=1)
    >>> m(torch.ones(2, 4)).shape
    torch.Size([2, 4])
    """

    def __init__(self, channels: int, act: str = "linear", alpha: float | None = None,
                 gain: float | None = None, clamp: float | None = None, dim: int = 1,
                 device=None, dtype=None):
        super().__init__()
        if not isinstance(channels, int) or channels < 0:
            raise ValueError(f"BiasAct: channels must be an int >= 0, got {channels!r}")
        if clamp is not None and not clamp >= 0:
            raise ValueError(f"BiasAct: clamp must be None (no clamping) or >= 0, got {clamp}")
        spec, self.alpha, self.gain = _resolve(act, alpha, gain)
        self.channels, self.act, self.dim = channels, spec.name, dim
        self._alpha_given = alpha
        self.clamp = None if clamp is None else float(clamp)
        self.bias = torch.nn.Parameter(torch.zeros(channels, device=device, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return bias_act(x, self.bias, dim=self.dim, act=self.act, alpha=self._alpha_given, gain=self.gain,
                        clamp=self.clamp)

    def extra_repr(self) -> str:
        parts = [str(self.channels), f"act={self.act!r}"]
        if self._alpha_given is not None or self.act in ("lrelu", "elu"):
            parts.append(f"alpha={self.alpha:g}")
        if self.gain != 1:
            parts.append(f"gain={self.gain:.4g}")
        if self.clamp is not None:
            parts.append(f"clamp={self.clamp:g}")
        parts.append(f"dim={self.dim}")
        return ", ".join(parts)
