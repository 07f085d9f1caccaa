"""Plain `pip install .` is pure Python. With OPFORGE_BUILD=all (or kinds/names, comma-separated)
the named kernels are compiled into opforge/_C; torch must then be visible to the build:
`OPFORGE_BUILD=all pip install --no-build-isolation .` (see opforge/aot.py)."""

import os
import sys

from setuptools import setup

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from opforge import settings

kwargs = {}
if settings.current().aot_build:
    from opforge.aot import setup_kwargs

    kwargs = setup_kwargs()
setup(**kwargs)
