"""``native_launch``: a GPU kernel's launch replayed from C++, one op call per launch.

Triton kernels are planned, tuned and first launched from Python (``kernels/triton_launch.py``), as
are the CUDA C++ kernels of ``kernels/tuned_op.py`` whose extension can describe their launch (the
block-sparse CUDA decode kernel). Once a call shape's launch is known, its *recipe* (the compiled
function, grid, outputs to allocate and the parameters in order: ``recipe.py``) is defined in the C++ variant, keyed by the
call's inputs; later calls of that shape are one op call that allocates the outputs, packs the
parameters (encoding TMA descriptors) and launches, with no Python in between (issue 21,
``docs/architecture.md`` #15). ``NativeTable`` is what a kernel family uses.
"""

from . import extensions  # noqa: F401  (registers the variants)
from .loader import NativeLaunchLoader
from .table import NativeTable

__all__ = ["NativeLaunchLoader", "NativeTable"]
