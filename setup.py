"""Plain `pip install .` is pure Python. With OPFORGE_BUILD=all (or kinds/names, comma-separated)
the named kernels are compiled into opforge/_C; torch must then be visible to the build:
`OPFORGE_BUILD=all pip install --no-build-isolation .` (see opforge/aot.py).

Every install also puts the startup hook `opforge-patch-torch.pth` in site-packages (see
_opforge_startup.py): `OPFORGE_PATCH_TORCH=1 python train.py` then patches torch with no `import opforge`."""

import os
import sys

from setuptools import setup
from setuptools.command.build_py import build_py

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _opforge_startup import PTH_LINE, PTH_NAME  # noqa: E402
from opforge import settings  # noqa: E402


class build_py_with_startup_hook(build_py):
    """build_py, plus the startup hook's .pth at the root of the wheel (purelib). An editable install
    (PEP 660) builds into a scratch build_lib and installs the package through its own finder: there the
    .pth goes straight into the wheel being made (the `install` command's install_lib), where the editable
    wheel's own `__editable__.*.pth` lies."""

    def run(self):
        super().run()
        root = self.get_finalized_command("install").install_lib if getattr(self, "editable_mode", False) \
            else self.build_lib
        os.makedirs(root, exist_ok=True)
        with open(os.path.join(root, PTH_NAME), "w", encoding="utf-8") as f:
            f.write(PTH_LINE)

    def get_outputs(self, include_bytecode=True):
        outputs = super().get_outputs(include_bytecode)
        return outputs if getattr(self, "editable_mode", False) else [*outputs, os.path.join(self.build_lib, PTH_NAME)]


kwargs = {}
if settings.current().aot_build:
    from opforge.aot import setup_kwargs

    kwargs = setup_kwargs()
kwargs["cmdclass"] = {**kwargs.get("cmdclass", {}), "build_py": build_py_with_startup_hook}
setup(**kwargs)
