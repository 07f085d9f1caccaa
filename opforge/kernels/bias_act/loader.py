from ...loader import KernelLoader


class BiasActLoader(KernelLoader):
    """``BiasActLoader().load().forward(x, b, dim, act, alpha, gain, clamp)``, ``.backward(...)``
    and ``.backward2(...)``: see ``opforge.kernels.bias_act.reference`` for the contract."""

    kind = "bias_act"
