"""User-facing optimizers: ``opforge.optim.CPUAdam``."""

from .cpu_adam import CPUAdam

__all__ = ["CPUAdam"]
