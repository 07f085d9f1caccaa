"""opforge's modules: thin ``torch.nn.Module`` wrappers over ``opforge.ops``."""

from .bias_act import BiasAct

__all__ = ["BiasAct"]
