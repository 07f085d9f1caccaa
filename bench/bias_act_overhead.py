"""Where a small ``bias_act`` call spends its time on the host: each layer of the call timed alone,
launch-bound, beside eager torch and torch.compile of the same expression.

Usage::

    .venv/bin/python bench/bias_act_overhead.py [--device cuda|cpu] [--shape 4x512x8x8] [--dtype fp16]
        [--variant bias_act_cuda] [--calls 2000] [--no-compile]

Each row runs ``--calls`` calls back to back, then synchronizes: per-call time = wall / calls,
the best of 7 such loops (small shapes: the host's cost per call, the GPU keeps up). Layers,
outermost last: ``torch.add`` (one native kernel launch, the floor of any op); on CUDA, a plain
pybind11 binding of the same kernels (``bench/csrc/bias_act_pybind.cpp``: the issue's floor peer); the variant's raw
forward op on preallocated tensors (``torch.ops`` dispatch, the stable-ABI boxing, the launch);
on CUDA, the variant's one-call forward (``forward_fresh``: y allocated and the geometry worked out
in C++, what the public op calls without grad); the kernel contract
(``dispatch.implementation(...).forward``: allocation, layout, the op); the public
``opforge.ops.bias_act`` (argument checks, defaults, the variant's choice); eager torch;
torch.compile (default mode). fwd+bwd rows: ``y = f(x, b); y.backward(dy)`` with x and b leaves;
opforge's through its C++ autograd node (the default for the CUDA variant, ``native_autograd.py``)
and through the Python autograd.Function.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

from opforge.bench.timing import loops

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
from bias_act import DTYPES, eager_fn, parse_shape, pybind_floor  # noqa: E402


def per_call(fn, calls: int, sync) -> float:
    for _ in range(max(20, calls // 10)):
        fn()
    sync()
    return min(loops(fn, calls, 7, after=sync))


def main() -> None:
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--device", choices=("cpu", "cuda"))
    ap.add_argument("--shape", type=parse_shape, default=(4, 512, 8, 8))
    ap.add_argument("--dtype", default="fp16")
    ap.add_argument("--variant", help="default: the loader's choice for the device")
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--no-compile", dest="compile", action="store_false")
    args = ap.parse_args()
    dev = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = DTYPES[args.dtype]
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)

    from opforge.kernels.bias_act import dispatch
    from opforge.kernels.bias_act.activations import lookup
    from opforge.kernels.bias_act.layout import clamp_as_stored, geometry
    from opforge.ops import bias_act

    act, alpha, gain, clamp = "lrelu", 0.2, 2**0.5, 256.0
    x = torch.randn(args.shape, device=dev, dtype=dtype)
    b = (0.1 * torch.randn(args.shape[1], device=dev)).to(dtype)
    dy = torch.randn_like(x)
    xg, bg = x.detach().requires_grad_(), b.detach().requires_grad_()
    impl = dispatch.implementation(dev, args.variant)
    eager = eager_fn(act, alpha, gain, clamp, x.ndim, 1)
    rows: list[tuple[str, float]] = [("torch.add (one launch)", per_call(lambda: torch.add(x, x), args.calls, sync))]
    ops = getattr(impl, "ops", None)
    if ops is not None and hasattr(ops, "forward"):
        y = torch.empty_like(x)
        g = geometry(y, 1, True)
        bk = b if getattr(impl, "any_bias_dtype", False) else b.float()
        idx = lookup(act).index
        rows.append(("raw op (preallocated)", per_call(
            lambda: ops.forward(x, bk, y, g.channels, g.inner, idx, alpha, gain, clamp), args.calls, sync)))
    if dev.type == "cuda":  # the floor: a plain pybind11 binding of the same kernels
        mod = pybind_floor(dev)
        idx = lookup(act).index
        rows.append(("pybind11 binding: forward (allocates y)", per_call(
            lambda: mod.forward(x, b, 1, idx, alpha, gain, clamp), args.calls, sync)))
        yp = mod.forward(x, b, 1, idx, alpha, gain, clamp)
        clamp_ref = clamp_as_stored(clamp, x.dtype)
        rows.append(("pybind11 binding: backward (dx, db)", per_call(
            lambda: mod.backward(dy, yp, b, 1, idx, 1, alpha, gain, clamp, clamp_ref), args.calls, sync)))
    fresh = getattr(impl, "fresh", None)
    if fresh is not None:  # the no-grad public op's one call: allocation and geometry in C++
        idx, c = lookup(act).index, -1.0 if clamp is None else clamp
        rows.append(("one-call op (forward_fresh: allocates y)", per_call(
            lambda: fresh(x, b, 1, idx, alpha, gain, c), args.calls, sync)))
    rows.append((f"contract ({impl.name if hasattr(impl, 'name') else impl.__name__})", per_call(
        lambda: impl.forward(x, b, 1, act, alpha, gain, clamp), args.calls, sync)))
    rows.append(("opforge.ops.bias_act", per_call(lambda: bias_act(x, b, act=act, clamp=clamp), args.calls, sync)))
    y = impl.forward(x, b, 1, act, alpha, gain, clamp)
    ref = lookup(act).ref_for(alpha, clamp)
    xr, yr = (x if ref == "x" else None), (y if ref == "y" else None)
    rows.append(("contract backward (dx, db)", per_call(
        lambda: impl.backward(dy, xr, b, yr, 1, act, alpha, gain, clamp, True), args.calls, sync)))
    rows.append(("eager", per_call(lambda: eager(x, b), args.calls, sync)))
    compiled = None
    if args.compile:
        compiled = torch.compile(eager)
        rows.append(("torch.compile", per_call(lambda: compiled(x, b), args.calls, sync)))

    def fb(f):
        def run():
            xg.grad = bg.grad = None
            f(xg, bg).backward(dy)
        return run

    rows.append(("fwd+bwd floor: x * 1.0 (one native op)", per_call(fb(lambda u, v: u * 1.0), args.calls // 2, sync)))
    rows.append(("fwd+bwd opforge.ops.bias_act", per_call(
        fb(lambda u, v: bias_act(u, v, act=act, clamp=clamp)), args.calls // 2, sync)))
    from opforge.kernels.bias_act import native_autograd

    kept, native_autograd.DEVICES = native_autograd.DEVICES, ()
    rows.append(("fwd+bwd opforge.ops.bias_act, Python autograd.Function", per_call(
        fb(lambda u, v: bias_act(u, v, act=act, clamp=clamp)), args.calls // 2, sync)))
    native_autograd.DEVICES = kept
    rows.append(("fwd+bwd eager", per_call(fb(eager), args.calls // 2, sync)))
    if compiled is not None:
        rows.append(("fwd+bwd torch.compile", per_call(fb(compiled), args.calls // 2, sync)))

    print(f"bias_act host cost per call, {'x'.join(map(str, args.shape))} {args.dtype} on {dev} "
          f"({torch.cuda.get_device_name(dev) if dev.type == 'cuda' else 'cpu'}), torch {torch.__version__}, "
          f"best of 7 loops of {args.calls} calls")
    width = max(len(r[0]) for r in rows)
    for name, s in rows:
        print(f"  {name.ljust(width)}  {s * 1e6:8.1f} µs")


if __name__ == "__main__":
    main()
