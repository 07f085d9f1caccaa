"""The torch variant of the tests' example kernel kind ("toy"): same ops as the selftest kernel."""

import torch


def axpy(x, y, alpha):
    return torch.add(y, x, alpha=alpha)


def simd_width():
    return 0
