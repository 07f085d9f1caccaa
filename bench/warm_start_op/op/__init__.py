from .fused_act import fused_leaky_relu
from .upfirdn2d import upfirdn2d

__all__ = ["fused_leaky_relu", "upfirdn2d"]
