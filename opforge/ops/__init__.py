"""opforge's ops as ``torch.library`` custom ops (``torch.ops.opforge.*``): fake
implementations for torch.compile, each dispatching to the kernel its loader picked."""

from .adam import adam_step_, adam_step_multi_
from .bias_act import bias_act
from .block_sparse import block_sparse_linear

__all__ = ["adam_step_", "adam_step_multi_", "bias_act", "block_sparse_linear"]
