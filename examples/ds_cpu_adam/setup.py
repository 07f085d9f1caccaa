"""Copies DeepSpeed's cpu_adam sources, unchanged, from the installed ``deepspeed`` into
``dsadam/csrc`` (the wheel carries them for the JIT path), then: a plain
``pip install --no-build-isolation .`` compiles nothing (the first use builds just in time);
``DSADAM_BUILD=all pip install --no-build-isolation .`` prebuilds every CPU variant into
``dsadam/_C`` (or name some: ``DSADAM_BUILD=dsadam_cpu_adam_avx2``)."""

import importlib.util
import os
import shutil
import sys

from setuptools import setup

HERE = os.path.dirname(os.path.abspath(__file__))
FILES = ("adam/cpu_adam.cpp", "adam/cpu_adam_impl.cpp", "includes/cpu_adam.h", "includes/simd.h", "includes/sve.h")


def copy_deepspeed_sources() -> None:
    found = importlib.util.find_spec("deepspeed")  # not imported: its import takes seconds and probes the machine
    if found is None or not found.submodule_search_locations:
        sys.exit("dsadam builds DeepSpeed's own cpu_adam sources: install DeepSpeed first "
                 "(DS_BUILD_OPS=0 pip install deepspeed), then this package with --no-build-isolation")
    csrc = os.path.join(found.submodule_search_locations[0], "ops", "csrc")
    for rel in FILES:
        dest = os.path.join(HERE, "dsadam", "csrc", rel)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        shutil.copyfile(os.path.join(csrc, rel), dest)


copy_deepspeed_sources()
sys.path.insert(0, HERE)
from dsadam.kernels import DSCPUAdamLoader  # noqa: E402

from opforge.aot import setup_extensions  # noqa: E402

setup(**setup_extensions([DSCPUAdamLoader], env="DSADAM_BUILD"))
