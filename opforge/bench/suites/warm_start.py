"""Warm starts: a new process's time from before the user's first import to its op ready, with a small
``TORCH_LIBRARY`` extension (``ATen/core/Tensor.h`` + ``torch/library.h``, a few seconds to build) already
in each loader's cache.

Cases: ``load`` (torch imported first, then the loader's import and its ``load`` call: ``torch.utils.
cpp_extension.load``, the baseline, against ``opforge.load``) and, but with ``--quick``, ``patched`` (``from
torch.utils.cpp_extension import load; load(...)``, torch alone against the same script with
``OPFORGE_PATCH_TORCH=1``, the variable alone). A sample is one new process's own window (``time.perf_counter`` inside it, so the interpreter's start
and torch's import are outside it); its first process builds, untimed. Checked: the op's result against torch's.
Nothing set that a user wouldn't set: ``TORCH_CUDA_ARCH_LIST`` and ``PYTHONDONTWRITEBYTECODE`` are taken out
of the children's environment. The sources and torch's extension dir live under the cache's
``.bench/warm_start``. ``bench/warm_start.py`` has the whole set (CUDA, StyleGAN's plugins, DeepSpeed, ColossalAI).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator

import torch

from ... import settings as settings_mod
from ...files import write_if_changed
from ..model import OPFORGE, PEER, Case, Impl
from .base import Suite

SOURCE = r"""
#include <ATen/core/Tensor.h>
#include <torch/library.h>

at::Tensor warm_axpy(const at::Tensor& x, double a) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kFloat && x.is_contiguous(), "warm_axpy: a contiguous float32 CPU tensor");
  at::Tensor out = x.new_empty(x.sizes());
  const float* xp = x.data_ptr<float>();
  float* op = out.data_ptr<float>();
  for (int64_t i = 0, n = x.numel(); i < n; ++i) op[i] = static_cast<float>(a) * xp[i] + 1.0f;
  return out;
}

TORCH_LIBRARY(opforge_warm_start, m) { m.def("warm_axpy(Tensor x, float a) -> Tensor"); }
TORCH_LIBRARY_IMPL(opforge_warm_start, CPU, m) { m.impl("warm_axpy", &warm_axpy); }
"""

CHILD = """import time
import torch
t0 = time.perf_counter()
{imports}
load({name!r}, [{source!r}], is_python_module=False)
x = torch.arange(-4, 5, dtype=torch.float32)
y = torch.ops.opforge_warm_start.warm_axpy(x, 0.5)
t1 = time.perf_counter()
print("WARM-START " + json.dumps({{"window_s": t1 - t0, "result": y.tolist()}}))
"""
IMPORTS = {"torch": "import json\nfrom torch.utils.cpp_extension import load",
           "opforge": "import json\nfrom opforge import load"}


class WarmStartSuite(Suite):
    kind = "warm_start"
    devices = ("cpu",)

    def __init__(self, device: torch.device, options):
        super().__init__(device, options)
        s = settings_mod.current()
        self.work = os.path.join(s.cache_dir, ".bench", "warm_start")
        os.makedirs(self.work, mode=0o700, exist_ok=True)
        self.source = os.path.join(self.work, "opforge_warm_start.cpp")
        write_if_changed(self.source, SOURCE)
        self.variant = "opforge.load"

    def env(self, patched: bool) -> dict:
        extra = {"TORCH_EXTENSIONS_DIR": os.path.join(self.work, "torch")}
        if patched:
            extra["OPFORGE_PATCH_TORCH"] = "1"
        return settings_mod.subprocess_env(("OPFORGE_PATCH_TORCH", "TORCH_CUDA_ARCH_LIST", "PYTHONDONTWRITEBYTECODE"),
                                           **extra)

    def impl(self, name: str, role: str, imports: str, patched: bool) -> Impl:
        code = CHILD.format(imports=imports, name="opforge_warm_start", source=self.source)
        env = self.env(patched)
        last: dict = {}

        def run() -> float:
            out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=1800,
                                 check=False)
            lines = [ln for ln in out.stdout.splitlines() if ln.startswith("WARM-START ")]
            if out.returncode != 0 or not lines:
                tail = (out.stderr.strip().splitlines() or ["no output"])[-1]
                raise RuntimeError(f"{name}'s process failed: {tail}")
            last.update(json.loads(lines[-1][len("WARM-START "):]))
            return last["window_s"]

        return Impl(name, role, run, output=lambda: torch.tensor(last["result"]), sample=run)

    def cases(self) -> Iterator[Case]:
        yield Case("load", "torch first", {"case": "load", "dtype": "fp32"},
                   (self.impl("torch load", PEER, IMPORTS["torch"], False),
                    self.impl("opforge.load", OPFORGE, IMPORTS["opforge"], False)), "torch load", tol=1e-6)
        if self.quick:
            return
        yield Case("patched", "the variable alone", {"case": "patched", "dtype": "fp32"},
                   (self.impl("torch load", PEER, IMPORTS["torch"], False),
                    self.impl("torch load, patched", OPFORGE, IMPORTS["torch"], True)), "torch load", tol=1e-6)
