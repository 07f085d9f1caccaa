"""Why ``opforge.ops.bias_act`` times slower than its kernel contract on a large tensor, where
the host's few microseconds should not show: each timed alone, event-timed per call after a
synchronize, in several orders (after eager's call, or after its own), median of 30.

    python3 bench/cuda_probe/op_gap.py
"""

from __future__ import annotations

import statistics

import torch
import torch.nn.functional as F

from opforge.kernels.bias_act import dispatch
from opforge.ops import bias_act


def timed(fn, before=None, reps=30):
    out = []
    for _ in range(reps + 3):
        if before is not None:
            before()
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) * 1e3)
    return statistics.median(out[3:])


def main() -> None:
    x = torch.randn(256, 512, 64, 64, device="cuda", dtype=torch.float16)
    b = (0.1 * torch.randn(512, device="cuda")).to(torch.float16)
    dst = torch.empty_like(x)
    impl = dispatch.implementation("cuda")
    gain = 2**0.5

    def contract():
        return impl.forward(x, b, 1, "lrelu", 0.2, gain, 256.0)

    def op():
        return bias_act(x, b, act="lrelu", clamp=256)

    def eager():
        return (F.leaky_relu(x + b.view(1, -1, 1, 1), 0.2) * gain).clamp(-256, 256)

    def into():  # the kernel into a preallocated y: no allocation at all
        impl.ops.forward(x, b, dst, 512, 4096, 3, 0.2, gain, 256.0)

    print(f"fp16 256x512x64x64 forward, µs per call (median of 30, event-timed alone), {impl.name}")
    for name, fn in (("copy_", lambda: dst.copy_(x)), ("raw op into preallocated y", into), ("contract", contract),
                     ("op", op), ("contract, result kept", contract), ("op, result kept", op)):
        keep = []
        f = (lambda fn=fn: keep.append(fn())) if "kept" in name else fn
        print(f"  {name:32s} {timed(f):8.1f}   after eager: {timed(f, before=eager):8.1f}")
        keep.clear()


if __name__ == "__main__":
    main()
