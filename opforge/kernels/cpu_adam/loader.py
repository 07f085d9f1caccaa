from ...loader import KernelLoader


class CPUAdamLoader(KernelLoader):
    """``CPUAdamLoader().load().adam_step_(param, grad, exp_avg, exp_avg_sq, ...)``."""

    kind = "cpu_adam"
