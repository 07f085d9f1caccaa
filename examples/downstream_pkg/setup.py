"""`pip install --no-build-isolation .` is pure Python (the kernel is built just in time, at
first use); `MYOPS_BUILD=all pip install --no-build-isolation .` prebuilds it into myops/_C."""

import os
import sys

from setuptools import setup

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from myops.kernels import ScaleAddLoader

from opforge.aot import setup_extensions

setup(**setup_extensions([ScaleAddLoader], env="MYOPS_BUILD"))
