"""Block-sparse matmul on a GPU: opforge against dense cuBLAS and torch's BSR kernels.

Usage::

    python bench/block_sparse.py [--dtype bf16,fp16] [--shapes 8192x4096x4096 16384x4096x14336]
        [--blocks 32,64,128] [--densities 0.5,0.25,0.1] [--decode 1,16,64] [--json FILE] [--markdown]

A shape is ``T x in x out``: ``y = x Wᵀ`` with ``x`` of ``(T, in)`` and ``W`` of ``(out, in)``.
For each (dtype, shape, block, density), a random block mask (seeded) and, per op:

* ``fwd``: ``y = x Wᵀ``; ``dgrad``: ``dx = dy W``; ``wgrad``: ``dW = dyᵀ x`` (opforge and BSR
  on the kept blocks only; dense: the whole weight);
* **dense**: cuBLAS through ``F.linear`` / ``mm`` on the dense weight (the mask applied);
* **torch BSR**: ``W.to_sparse_bsr(block)`` with ``torch.sparse._triton_ops.bsr_dense_mm``
  (fwd: ``W_bsr @ xᵀ``; dgrad: ``Wᵀ_bsr @ dyᵀ``) and ``sampled_addmm`` (wgrad);
* **opforge**: the loader's variant for CUDA tensors (its contract: no autograd, no checks).

Times: ``triton.testing.do_bench`` (L2 cleared before each call, median): the GPU's time; beside
it the host's µs per call (20 calls issued back to back, no sync inside, the median of 5 loops)
of the same function. TFLOP/s count the
useful FLOPs (2 T in out × density, the kept blocks' work) for every row, dense included, so
"vs dense" is the speedup and "ideal" is 1 / density. Decode (``--decode``, T <= 64, fwd, on
``--decode-shape``): GB/s of the kept weight's bytes against a device-to-device copy of as
many bytes, both timed as CUDA graph replays (``do_bench_cudagraph``: the GPU's time, as a
decoder that captures its step sees it; host launch costs would otherwise be most of it).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from opforge.bench.timing import loops

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


def bench(fn, graph: bool = False) -> float | None:
    import triton.testing

    try:
        if graph:  # the GPU's time alone: one CUDA graph of the call, replayed (how decoders run)
            fn()
            return triton.testing.do_bench_cudagraph(fn, rep=50, return_mode="median") / 1e3
        return triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median") / 1e3
    except Exception as exc:  # noqa: BLE001 - a peer that can't run a case: reported, not fatal
        print(f"    failed: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}", file=sys.stderr)
        return None


def host_time(fn, calls: int = 20) -> float | None:
    """The host's seconds per call: ``calls`` calls issued back to back, no sync inside (the
    median of 5 loops); the GPU's queue absorbs them."""
    try:
        fn()
        samples = loops(fn, calls, 5, before=torch.cuda.synchronize)
        torch.cuda.synchronize()
        return statistics.median(samples)
    except Exception:  # noqa: BLE001 - bench() reports the failure
        return None


def torch_bsr(w_dense: torch.Tensor, block: int):
    """torch's BSR kernels, or None with the reason."""
    try:
        from torch.sparse._triton_ops import bsr_dense_mm, sampled_addmm
    except ImportError as exc:
        return None, f"torch.sparse._triton_ops missing: {exc}"
    try:
        w_bsr = w_dense.to_sparse_bsr((block, block))
        wt_bsr = w_dense.t().contiguous().to_sparse_bsr((block, block))
    except Exception as exc:  # noqa: BLE001
        return None, f"to_sparse_bsr failed: {exc}"
    return (w_bsr, wt_bsr, bsr_dense_mm, sampled_addmm), ""


def run_case(impl, dtype, tokens, k_in, n_out, block, density, seed=0) -> list[dict]:
    from opforge.kernels.block_sparse.layout import BlockSparseLayout

    dev = torch.device("cuda")
    g = torch.Generator().manual_seed(seed)
    layout = BlockSparseLayout.random(n_out, k_in, density, (block, block), generator=g)
    idx = layout.indices(dev)
    x = torch.randn(tokens, k_in, device=dev, dtype=dtype)
    dy = torch.randn(tokens, n_out, device=dev, dtype=dtype)
    w = (torch.randn(layout.nnz, block, block, device=dev) / k_in**0.5).to(dtype)
    w_dense = layout.scatter(w)
    useful = 2.0 * tokens * k_in * n_out * layout.density
    rows = []
    bsr, why = torch_bsr(w_dense, block)
    cases = {
        "fwd": {
            "dense": lambda: F.linear(x, w_dense),
            "torch BSR": (lambda: bsr[2](bsr[0], x.t())) if bsr else None,
            "opforge": lambda: impl.forward(x, w, None, idx.rows, idx.cols, idx.row_ptr, n_out),
        },
        "dgrad": {
            "dense": lambda: torch.mm(dy, w_dense),
            "torch BSR": (lambda: bsr[2](bsr[1], dy.t())) if bsr else None,
            "opforge": lambda: impl.grad_input(dy, w, idx.rows, idx.cols, idx.col_ptr, idx.col_order, k_in),
        },
        "wgrad": {
            "dense": lambda: torch.mm(dy.t(), x),
            "torch BSR": (lambda: bsr[3](bsr[0], dy.t(), x, beta=0.0)) if bsr else None,
            "opforge": lambda: impl.grad_weight(dy, x, idx.rows, idx.cols, idx.row_ptr, block, block),
        },
    }
    # correctness of opforge against dense first (fp32 accumulate on both sides)
    got = impl.forward(x, w, None, idx.rows, idx.cols, idx.row_ptr, n_out).float()
    ref = F.linear(x, w_dense).float()
    err = ((got - ref).norm() / ref.norm().clamp_min(1e-30)).item()
    for op, fns in cases.items():
        times = {name: (bench(fn) if fn is not None else None) for name, fn in fns.items()}
        hosts = {name: (host_time(fn) if fn is not None else None) for name, fn in fns.items()}
        for name, t in times.items():
            rows.append({
                "dtype": str(dtype).replace("torch.", ""), "shape": f"{tokens}x{k_in}x{n_out}", "block": block,
                "density": round(layout.density, 4), "op": op, "impl": name, "seconds": t, "host_s": hosts[name],
                "tflops": useful / t / 1e12 if t else None,
                "vs_dense": times["dense"] / t if t and times["dense"] else None,
                "ideal": 1.0 / layout.density, "note": why if name == "torch BSR" and not bsr else "",
                "fwd_rel_err": err if name == "opforge" else None,
            })
    return rows


def decode_case(impl, dtype, tokens, k_in, n_out, block, density, seed=0) -> dict:
    from opforge.kernels.block_sparse.layout import BlockSparseLayout

    dev = torch.device("cuda")
    layout = BlockSparseLayout.random(n_out, k_in, density, (block, block),
                                      generator=torch.Generator().manual_seed(seed))
    idx = layout.indices(dev)
    x = torch.randn(tokens, k_in, device=dev, dtype=dtype)
    w = torch.randn(layout.nnz, block, block, device=dev, dtype=dtype)
    t = bench(lambda: impl.forward(x, w, None, idx.rows, idx.cols, idx.row_ptr, n_out), graph=True)
    src = torch.empty_like(w)
    dst = torch.empty_like(w)
    tc = bench(lambda: dst.copy_(src), graph=True)
    nbytes = w.numel() * w.element_size()
    return {"dtype": str(dtype).replace("torch.", ""), "tokens": tokens, "shape": f"{k_in}x{n_out}", "block": block,
            "density": round(layout.density, 4), "seconds": t, "weight_GBps": nbytes / t / 1e9 if t else None,
            "copy_GBps": 2 * nbytes / tc / 1e9 if tc else None,
            "pct_copy": (nbytes / t) / (2 * nbytes / tc) if t and tc else None}


def fmt_t(t):
    return "-" if t is None else (f"{t * 1e3:.3f} ms" if t >= 1e-3 else f"{t * 1e6:.1f} µs")


def main() -> None:
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--dtype", default="bf16,fp16")
    ap.add_argument("--shapes", nargs="*", default=["8192x4096x4096", "16384x4096x14336"])
    ap.add_argument("--blocks", default="32,64,128")
    ap.add_argument("--densities", default="0.5,0.25,0.1")
    ap.add_argument("--decode", default="1,16,64", help="token counts of the decode case ('' for none)")
    ap.add_argument("--decode-shape", default="4096x14336", help="in x out of the decode case")
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench/block_sparse.py needs a CUDA GPU")
    from opforge.kernel_loader import BlockSparseLoader

    kernel = BlockSparseLoader().load(device="cuda")
    impl = kernel.ops
    started = time.time()
    info = {"date": time.strftime("%Y-%m-%d %H:%M"), "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
            "python": platform.python_version(), "variant": kernel.name}
    try:
        import triton
        info["triton"] = triton.__version__
    except ImportError:
        pass
    print(f"block_sparse on {info['gpu']}, torch {info['torch']}, triton {info.get('triton')}, {info['variant']}")
    rows, decode = [], []
    for dname in args.dtype.split(","):
        dtype = DTYPES[dname]
        for shape in args.shapes:
            tokens, k_in, n_out = (int(v) for v in shape.split("x"))
            for block in (int(b) for b in args.blocks.split(",")):
                for density in (float(d) for d in args.densities.split(",")):
                    print(f"  {dname} {shape} block {block} density {density}", file=sys.stderr, flush=True)
                    rows += run_case(impl, dtype, tokens, k_in, n_out, block, density)
        for tokens in (int(t) for t in args.decode.split(",") if t):
            for block in (int(b) for b in args.blocks.split(",")):
                for density in (float(d) for d in args.densities.split(",")):
                    k_in, n_out = (int(v) for v in args.decode_shape.split("x"))
                    decode.append(decode_case(impl, dtype, tokens, k_in, n_out, block, density))
    print("\n| dtype | shape | block | density | op | dense | torch BSR | opforge | opforge TFLOP/s | vs dense "
          "| ideal | vs BSR | host µs: dense / BSR / opforge |")
    print("|---|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    key = lambda r: (r["dtype"], r["shape"], r["block"], r["density"], r["op"])  # noqa: E731
    groups: dict = {}
    for r in rows:
        groups.setdefault(key(r), {})[r["impl"]] = r
    for k, g in groups.items():
        o, d, b = g["opforge"], g["dense"], g["torch BSR"]
        vs_bsr = b["seconds"] / o["seconds"] if b["seconds"] and o["seconds"] else None
        print(f"| {k[0]} | {k[1]} | {k[2]} | {k[3]:.3f} | {k[4]} | {fmt_t(d['seconds'])} | {fmt_t(b['seconds'])} | "
              f"{fmt_t(o['seconds'])} | {o['tflops'] or 0:.0f} | {o['vs_dense'] or 0:.2f}x | {o['ideal']:.1f}x | "
              + (f"{vs_bsr:.2f}x |" if vs_bsr else "- |")
              + " " + " / ".join("-" if g[i]["host_s"] is None else f"{g[i]['host_s'] * 1e6:.0f}"
                                 for i in ("dense", "torch BSR", "opforge")) + " |")
    if decode:
        print("\n| dtype | T | weight | block | density | opforge | weight GB/s | copy GB/s | % copy |")
        print("|---|---:|---|---:|---:|---:|---:|---:|---:|")
        for r in decode:
            print(f"| {r['dtype']} | {r['tokens']} | {r['shape']} | {r['block']} | {r['density']:.3f} | "
                  f"{fmt_t(r['seconds'])} | {r['weight_GBps'] or 0:.0f} | {r['copy_GBps'] or 0:.0f} | "
                  f"{(r['pct_copy'] or 0) * 100:.0f}% |")
    errs = [r["fwd_rel_err"] for r in rows if r["fwd_rel_err"] is not None]
    print(f"\nopforge fwd against dense: max relative error {max(errs):.2e}" if errs else "")
    print(f"wall time: {time.time() - started:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"info": info, "rows": rows, "decode": decode}, f, indent=1)


if __name__ == "__main__":
    main()
