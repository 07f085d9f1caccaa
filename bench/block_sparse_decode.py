"""Block-sparse decode at the memory floor (issue 35): each layer shape alone and a stack of
Llama MLP blocks, ``BlockSparseLinear`` at densities 0.5 / 0.25 / 0.1 against dense, with
torch BSR and torchao in the same run.

Usage::

    python bench/block_sparse_decode.py [--tokens 1,16,64] [--densities 0.5,0.25,0.1] [--layers 16]
        [--shapes 4096x14336,14336x4096] [--blocks 64] [--prefill 2048:4096x4096:64,64:14336x4096:128]
        [--no-stack] [--compiled-tokens 1] [--no-peers] [--json FILE]

**Each layer alone.** ``--layers`` copies of the layer (their own weights and, sparse, their own
random layout), called one after the other on the same input, so that every call reads its
weight from HBM as a model's layers do (the weights of 16 layers of 4096->14336 are 1.9 GB
dense, far past L2). Per layer:

* **graph µs**: the L calls captured in one CUDA graph and replayed (GPU time alone; median of
  7 replays), divided by L;
* **b2b µs**: the same L calls issued back to back (CUDA events around them; no graph), per call;
* **host µs**: the host's time to issue one call of that loop (no sync);
* **GB/s**: the layer's weight bytes (kept blocks only, for sparse) over its graph time; **% of
  dense**: that, over the bytes per second dense ``F.linear`` reaches at T=1 on the same shape in
  this run (the issue's bandwidth target).

Implementations: ``dense`` (``F.linear``, cuBLAS), ``opforge`` (``BlockSparseLinear``), ``torch
BSR`` (``bsr_dense_mm`` on a ``to_sparse_bsr`` weight) and ``torchao`` (``BlockSparseTensor``
through ``F.linear``); a peer that is missing or can't be captured is timed back to back only, or
reported. opforge's first layer is checked against ``F.linear`` on its masked dense weight.

**The MLP stack** (``--no-stack`` skips it): L SwiGLU blocks (gate and up 4096->14336, down
14336->4096, a residual add; ``opforge.bench.suites.block_sparse_decode``), one decode step of T
tokens, graph-replayed and eager: tokens per second, and the weight bytes per second reached. At the
T of ``--compiled-tokens`` (default 1) also through ``torch.compile(fullgraph=True)``, dense and sparse
alike (inductor fuses each block's silu and mul; the linear layers stay cuBLAS's and opforge's kernels),
then graph-captured the same way.

**Prefill rows** (``--prefill T:INxOUT:BLOCKS``): the same layer-alone timing at other sizes
(the issue's T=2048 and long-K T=64 rows), density 0.5.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
import warnings

import torch
import torch.nn.functional as F

from opforge.bench.suites.block_sparse_decode import Captured, mlp_stack, run_stack, weight_bytes
from opforge.bench.timing import Clock

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def graph_us(fn, dev, calls: int, replays: int = 7) -> float:
    """GPU µs per call of ``fn`` (which makes ``calls`` calls), captured once and replayed."""
    g = Captured(fn, dev)
    clock = Clock(dev, flush=False)
    g()
    times = [clock.batch(g, 1)[0] for _ in range(replays)]
    return statistics.median(times) / calls * 1e6


def b2b_us(fn, dev, calls: int, rounds: int = 7) -> tuple[float, float]:
    """(GPU µs per call back to back, host µs per call) of ``fn`` (which makes ``calls`` calls)."""
    clock = Clock(dev, flush=False)
    fn()
    gpu, host = [], []
    for _ in range(rounds):
        s, h = clock.batch(fn, 1)
        gpu.append(s)
        host.append(h)
    return statistics.median(gpu) / calls * 1e6, statistics.median(host) / calls * 1e6


def timed(name: str, fn, dev, calls: int, graph: bool = True) -> dict:
    row = {"impl": name}
    try:
        row["b2b_us"], row["host_us"] = b2b_us(fn, dev, calls)
    except Exception as exc:  # noqa: BLE001 - a peer that can't run here: reported
        return {**row, "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:100] if str(exc) else ''}"}
    if graph:
        try:
            row["graph_us"] = graph_us(fn, dev, calls)
        except Exception as exc:  # noqa: BLE001 - some peers can't be captured: back to back only
            row["graph_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:100] if str(exc) else ''}"
            torch.cuda.synchronize()
    return row


def peer_fns(dense_ws: list, block: int) -> dict:
    out = {}
    try:
        from torch.sparse._triton_ops import bsr_dense_mm

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            bsrs = [w.to_sparse_bsr((block, block)) for w in dense_ws]
        out["torch BSR"] = lambda x: [bsr_dense_mm(w, x.t()).t() for w in bsrs]
    except Exception as exc:  # noqa: BLE001
        out["torch BSR"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:100]}"
    try:
        from torchao.sparsity.blocksparse import BlockSparseTensor

        aos = [BlockSparseTensor.from_dense(w, block) for w in dense_ws]
        out["torchao"] = lambda x: [F.linear(x, w, None) for w in aos]
    except Exception as exc:  # noqa: BLE001
        out["torchao"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:100]}"
    return out


def layer_rows(k_in, n_out, tokens, densities, blocks, layers, dtype, dev, peers, dense_bw) -> list:
    """Each layer alone: dense once per (shape, T), then each (block, density)."""
    from opforge.kernels.block_sparse.layout import BlockSparseLayout
    from opforge.nn import BlockSparseLinear

    rows = []
    torch.manual_seed(0)
    x = torch.randn(tokens, k_in, device=dev, dtype=dtype)
    dense_ws = [torch.randn(n_out, k_in, device=dev, dtype=dtype) / k_in**0.5 for _ in range(layers)]
    dense = timed("dense", lambda: [F.linear(x, w) for w in dense_ws], dev, layers)
    dense_ws = None  # freed (the lambda above is done with it)
    dense_bytes = n_out * k_in * x.element_size()
    dense["GBps"] = dense_bytes / dense["graph_us"] / 1e3
    if tokens == 1:
        dense_bw.setdefault((k_in, n_out), dense["GBps"])
    for block in blocks:
        for density in densities:
            g = torch.Generator().manual_seed(1)
            mods = [BlockSparseLinear(k_in, n_out, bias=False, device=dev, dtype=dtype, layout=BlockSparseLayout.random(
                n_out, k_in, density, (block, block), generator=g)).requires_grad_(False) for _ in range(layers)]
            nbytes = mods[0].weight_blocks.numel() * x.element_size()
            with torch.no_grad():
                ref = F.linear(x, mods[0].to_dense())
                got = mods[0](x)
            err = float((got.double() - ref.double()).norm() / ref.double().norm())
            case = {"in": k_in, "out": n_out, "tokens": tokens, "block": block, "density": density,
                    "weight_bytes": nbytes, "dense_weight_bytes": dense_bytes, "rel_err": err,
                    "rows": [dict(dense)]}
            with torch.no_grad():
                ours = timed("opforge", lambda: [m(x) for m in mods], dev, layers)
            case["rows"].append(ours)
            if peers:
                for name, fn in peer_fns([m.to_dense() for m in mods], block).items():
                    if isinstance(fn, str):
                        case["rows"].append({"impl": name, "error": fn})
                        continue
                    case["rows"].append(timed(name, lambda fn=fn: fn(x), dev, layers))
                    torch.cuda.empty_cache()
            for r in case["rows"][1:]:
                if "graph_us" in r:
                    r["vs_dense"] = dense["graph_us"] / r["graph_us"]
                    r["GBps"] = nbytes / r["graph_us"] / 1e3
                    ref_bw = dense_bw.get((k_in, n_out))
                    if ref_bw:
                        r["pct_dense_bw"] = 100 * r["GBps"] / ref_bw
                elif "b2b_us" in r:
                    r["vs_dense_b2b"] = dense["b2b_us"] / r["b2b_us"]
            rows.append(case)
            print(line(case), flush=True)
            mods = None
            torch.cuda.empty_cache()
    return rows


def line(case: dict) -> str:
    parts = []
    for r in case["rows"]:
        if "error" in r:
            parts.append(f"{r['impl']}: {r['error'][:60]}")
            continue
        g = f"{r['graph_us']:.1f}" if "graph_us" in r else "-"
        extra = ""
        if "vs_dense" in r:
            extra = f" {r['vs_dense']:.2f}x {r['GBps']:.0f} GB/s"
            if "pct_dense_bw" in r:
                extra += f" ({r['pct_dense_bw']:.0f}% of dense)"
        elif "vs_dense_b2b" in r:
            extra = f" b2b {r['vs_dense_b2b']:.2f}x"
        elif r["impl"] == "dense":
            extra = f" {r['GBps']:.0f} GB/s"
        parts.append(f"{r['impl']} graph {g} / b2b {r['b2b_us']:.1f} / host {r['host_us']:.1f}{extra}")
    return (f"{case['in']}->{case['out']} T={case['tokens']} {case['block']}-blocks d={case['density']} "
            f"(err {case['rel_err']:.1e}): " + "; ".join(parts))


def stack_steps(stack, tokens: list, compiled_tokens: list, hidden: int, dev, dtype):
    """For each T of ``tokens``, then each of ``compiled_tokens`` compiled: (T, compiled, graph µs, b2b µs, host µs)
    of one decode step through ``stack``. Compiled: the step through ``torch.compile(fullgraph=True)`` (inductor
    fuses each block's silu and mul, as a model served compiled runs them; opforge's ops stay its own kernels),
    checked against the eager step, then captured as the eager one is."""
    for t, compiled in [(t, False) for t in tokens] + [(t, True) for t in compiled_tokens]:
        x = torch.randn(t, hidden, device=dev, dtype=dtype)
        step = lambda: run_stack(stack, x)  # noqa: E731, B023
        with torch.no_grad():
            if compiled:
                torch.compiler.reset()
                fn = torch.compile(lambda h: run_stack(stack, h), fullgraph=True)  # noqa: B023
                got = fn(x).float()  # compiled before any eager call of the stack, as a served model is
                want = run_stack(stack, x).float()
                err = ((got - want).abs().max() / want.abs().max().clamp_min(1e-6)).item()
                if err > 2e-2:
                    raise AssertionError(f"the compiled stack differs from eager at T={t}: {err:.3g}")
                step = lambda: fn(x)  # noqa: E731, B023
            yield t, compiled, graph_us(step, dev, 1), *b2b_us(step, dev, 1)


def stack_rows(tokens, densities, block, layers, dtype, dev, compiled_tokens=()) -> list:
    from opforge.bench.suites.block_sparse_decode import LLAMA

    hidden, inter = LLAMA
    out = []
    dense = mlp_stack(layers, hidden, inter, None, block, dev, dtype)
    dense_bytes = weight_bytes(dense)
    base = {}
    for t, compiled, g, b, h in stack_steps(dense, tokens, compiled_tokens, hidden, dev, dtype):
        base[t, compiled] = (g, b)
        out.append({"tokens": t, "density": 1.0, "impl": "dense", "compiled": compiled, "weight_bytes": dense_bytes,
                    "graph_us": g, "b2b_us": b, "host_us": h})
    dense = None
    torch.cuda.empty_cache()
    for density in densities:
        sparse = mlp_stack(layers, hidden, inter, density, block, dev, dtype)
        nbytes = weight_bytes(sparse)
        for t, compiled, g, b, h in stack_steps(sparse, tokens, compiled_tokens, hidden, dev, dtype):
            dg, db = base[t, compiled]
            out.append({"tokens": t, "density": density, "impl": "opforge", "compiled": compiled,
                        "weight_bytes": nbytes, "graph_us": g, "b2b_us": b, "host_us": h, "vs_dense": dg / g,
                        "vs_dense_b2b": db / b})
        sparse = None
        torch.cuda.empty_cache()
    dense_t1 = next(d for d in out if d["impl"] == "dense" and d["tokens"] == min(tokens) and not d["compiled"])
    for r in out:
        r["tokens_per_s"] = r["tokens"] / r["graph_us"] * 1e6
        r["GBps"] = r["weight_bytes"] / r["graph_us"] / 1e3
        r["pct_dense_bw"] = 100 * r["GBps"] / (dense_t1["weight_bytes"] / dense_t1["graph_us"] / 1e3)
        print(f"stack {layers}x SwiGLU T={r['tokens']}{' compiled' if r['compiled'] else ''} {r['impl']} "
              f"d={r['density']}: graph {r['graph_us']:.0f} us ({r['tokens_per_s']:.0f} tok/s, {r['GBps']:.0f} GB/s, "
              f"{r['pct_dense_bw']:.0f}% of dense's) "
              f"{format(r['vs_dense'], '.2f') + 'x dense' if 'vs_dense' in r else ''}; eager {r['b2b_us']:.0f} us, host "
              f"{r['host_us']:.0f} us", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--tokens", default="1,16,64")
    ap.add_argument("--densities", default="0.5,0.25,0.1")
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--shapes", default="4096x14336,14336x4096")
    ap.add_argument("--blocks", default="64")
    ap.add_argument("--prefill", default="2048:4096x4096:64+128,64:14336x4096:128",
                    help="T:INxOUT:BLOCK+BLOCK,...  (density 0.5; '' for none)")
    ap.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    ap.add_argument("--no-stack", dest="stack", action="store_false")
    ap.add_argument("--compiled-tokens", default="1",
                    help="the stack's T also timed through torch.compile (comma-separated; '' for none)")
    ap.add_argument("--no-peers", dest="peers", action="store_false")
    ap.add_argument("--json")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench/block_sparse_decode.py needs a CUDA GPU")
    dev, dtype = torch.device("cuda"), DTYPES[args.dtype]
    tokens = [int(t) for t in args.tokens.split(",")]
    densities = [float(d) for d in args.densities.split(",")]
    blocks = [int(b) for b in args.blocks.split(",")]
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "python": platform.python_version(),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "dtype": args.dtype, "layers": args.layers}
    try:
        import triton
        meta["triton"] = triton.__version__
    except ImportError:
        pass
    print(meta, flush=True)
    doc = {"meta": meta, "layers": [], "prefill": [], "stack": []}
    dense_bw: dict = {}
    for shape in args.shapes.split(","):
        k_in, n_out = map(int, shape.split("x"))
        for t in sorted(tokens):
            doc["layers"] += layer_rows(k_in, n_out, t, densities, blocks, args.layers, dtype, dev, args.peers,
                                        dense_bw)
    for spec in filter(None, args.prefill.split(",")):
        t, shape, bl = spec.split(":")
        k_in, n_out = map(int, shape.split("x"))
        doc["prefill"] += layer_rows(k_in, n_out, int(t), [0.5], [int(b) for b in bl.split("+")], args.layers,
                                     dtype, dev, args.peers, dense_bw)
    if args.stack:
        doc["stack"] = stack_rows(tokens, densities, blocks[0], args.layers, dtype, dev,
                                  [int(t) for t in filter(None, args.compiled_tokens.split(","))])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
