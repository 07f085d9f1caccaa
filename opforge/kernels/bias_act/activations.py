"""The ``bias_act`` activations: one frozen row each, pure data.

``ref`` says what the first derivative is computed from, and so what the forward saves:

* ``"y"``: the output (``relu``, ``lrelu``, ``tanh``, ``sigmoid``, ``elu``, ``selu``,
  ``softplus``). The output is usually kept alive by the next layer anyway, so nothing
  new is held for the backward. The activation's value is ``y / gain``.
* ``"x"``: the input and the bias, from which ``x + b`` is recomputed (``swish``,
  ``gelu``, ``gelu_tanh``: their derivative is not a function of their value).
* ``""``: nothing (``linear``); with ``clamp`` set it needs ``y``, for the clamp mask.

``Activation.ref_for(alpha, clamp)`` resolves those two special cases (and a negative
``alpha`` for ``lrelu``/``elu``, whose value no longer tells the sign of its input).

``has_2nd_grad``: the second derivative is not zero almost everywhere. For ``linear``,
``relu`` and ``lrelu`` the double backward only flows through the incoming gradient.

``index`` is a stable code for compiled kernels (C++/CUDA switch on it); never renumber.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

SELU_ALPHA = 1.6732632423543772848170429916717
SELU_SCALE = 1.0507009873554804934193349852946


@dataclass(frozen=True)
class Activation:
    name: str
    index: int
    ref: str
    """``"x"``, ``"y"`` or ``""``: what the first derivative needs (see the module doc)."""
    has_2nd_grad: bool
    default_alpha: float = 0.0
    default_gain: float = 1.0
    uses_alpha: bool = False
    """Only ``lrelu`` (negative slope) and ``elu`` (its alpha) take ``alpha``."""
    doc: str = ""

    def ref_for(self, alpha: float, clamp: float | None) -> str:
        """What the forward must save for this call: ``"x"``, ``"y"`` or ``""``."""
        if self.ref == "y" and self.uses_alpha and alpha < 0:
            return "x"
        if self.ref == "" and clamp is not None:
            return "y"
        return self.ref


_SQRT2 = math.sqrt(2.0)

ACTIVATIONS: dict[str, Activation] = {a.name: a for a in (
    Activation("linear", 1, "", False, doc="x"),
    Activation("relu", 2, "y", False, default_gain=_SQRT2, doc="max(x, 0)"),
    Activation("lrelu", 3, "y", False, default_alpha=0.2, default_gain=_SQRT2, uses_alpha=True,
               doc="x if x > 0 else alpha * x"),
    Activation("tanh", 4, "y", True, doc="tanh(x)"),
    Activation("sigmoid", 5, "y", True, doc="1 / (1 + exp(-x))"),
    Activation("elu", 6, "y", True, default_alpha=1.0, uses_alpha=True, doc="x if x > 0 else alpha * (exp(x) - 1)"),
    Activation("selu", 7, "y", True, doc="scale * (x if x > 0 else alpha * (exp(x) - 1)), torch's constants"),
    Activation("softplus", 8, "y", True, doc="log(1 + exp(x)) (x itself above 20, as torch)"),
    Activation("swish", 9, "x", True, default_gain=_SQRT2, doc="x * sigmoid(x) (SiLU)"),
    Activation("gelu", 10, "x", True, doc="x * Phi(x), Phi the normal CDF (erf)"),
    Activation("gelu_tanh", 11, "x", True,
               doc="0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x**3))) (torch's approximate='tanh')"),
)}

NAMES: tuple[str, ...] = tuple(ACTIVATIONS)


def lookup(name: str) -> Activation:
    """The row for ``name``, or a ValueError that lists the valid names."""
    found = ACTIVATIONS.get(name) if isinstance(name, str) else None
    if found is None:
        raise ValueError(f"bias_act: unknown activation {name!r}; use one of: {', '.join(NAMES)}")
    return found


__all__ = ["ACTIVATIONS", "NAMES", "SELU_ALPHA", "SELU_SCALE", "Activation", "lookup"]
