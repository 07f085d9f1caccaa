from ...loader import KernelLoader


class NativeLaunchLoader(KernelLoader):
    """``NativeLaunchLoader().load().define(...)``, ``.call(...)``, ``.pack(...)``, ``.forget()``,
    ``.stats()``: see ``opforge.kernels.native_launch.reference`` for the contract."""

    kind = "native_launch"
