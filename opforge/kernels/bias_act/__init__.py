"""``bias_act``: ``y = clamp(act(x + b) * gain, -clamp, clamp)``, ``b`` broadcast along one dim,
as StyleGAN2/3's ``bias_act`` (activations in ``activations.py``).

Variants, best first: CUDA, Triton, C++ per CPU ISA (AVX-512, AVX2, NEON, portable), then the
pure-torch reference (``reference.py``, which also states the kernel contract: ``forward``,
``backward``, ``backward2``). The op and its autograd live in ``opforge.ops.bias_act``.
"""

from . import extensions  # noqa: F401  (registers the variants)
from .activations import ACTIVATIONS, Activation
from .loader import BiasActLoader

__all__ = ["ACTIVATIONS", "Activation", "BiasActLoader"]
