from ...loader import KernelLoader


class SelftestLoader(KernelLoader):
    """``SelftestLoader().load().axpy(x, y, alpha)``."""

    kind = "selftest"
