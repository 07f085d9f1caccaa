"""The bias_act variants, best first. Only the torch one so far; compiled and Triton variants
implement the same three functions (``reference.py``'s contract) at a higher priority."""

from ...extension import TorchExtension
from .loader import BiasActLoader


@BiasActLoader.register_extension
class BiasActTorch(TorchExtension):
    name, kind, priority = "bias_act_torch", "bias_act", 0
    module = "opforge.kernels.bias_act.reference"
