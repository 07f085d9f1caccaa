"""What a model sees when it swaps ``nn.Linear`` for ``BlockSparseLinear``: the host's cost of a
call and the GPU's time, at decode, prefill and training shapes, beside dense and the peers.

Usage::

    python bench/block_sparse_calls.py [--tokens 16,2048,8192] [--shape 4096x4096] [--block 64]
        [--densities 0.5,0.25,0.1] [--dtype bf16] [--calls 50] [--json FILE] [--markdown]

For each (tokens, density), fwd (no grad) and fwd+bwd (``y = f(x); y.backward(dy)``, x and the
weights requiring grad), each implementation:

* **host µs**: CPU wall time of ``--calls`` calls enqueued back to back (no sync inside; the
  GPU's queue never fills at these counts), per call, the median of 9 rounds, the
  implementations of one op interleaved in a rotating order each round (the host's speed drifts),
  Python's garbage collector off while timing (as ``timeit`` does);
* **GPU µs back to back**: CUDA events around the same loop, per call: what a training or
  serving loop sees, host and GPU overlapped (the larger of the two wins);
* **graph µs**: one call (fwd, or a whole fwd+bwd step, the gradients accumulated in place as
  eager's are) captured in a CUDA graph and replayed, the GPU's time alone. A fwd+bwd step's
  host time is mostly autograd's (``backward`` hands the graph to the engine's device thread and
  waits), the same for every implementation, so where it exceeds the GPU's the b2b column
  measures the host.

Implementations: dense ``F.linear`` on the masked dense weight (cuBLAS); ``BlockSparseLinear``
(opforge: its launches replayed from C++, ``kernels/native_launch``, and training through the C++
autograd node); the same with every launch made from Python and training through the Python
``autograd.Function`` (as before the C++ path; "Python launch"); torchao's ``BlockSparseTensor``
through ``F.linear`` (fwd only: it has no backward; ``bias=None`` as it requires); torch's BSR
(``bsr_dense_mm``, fwd only); and, for fwd+bwd, the host's floor: a backward through one node of
one element, what autograd alone costs a step. A peer that is not installed or fails is reported
as such.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from opforge.bench.timing import Clock

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


def host_and_gpu(fns: dict, calls: int, rounds: int = 9) -> dict:
    """{name: (host s per call, GPU s per call back to back)}: the median of ``rounds`` rounds,
    the implementations interleaved in a rotating order each round, so a slow spell of the host
    (its figures vary 2x from minute to minute on the H100 machines) hits them alike. A name
    whose call raises maps to the exception."""
    live, out = {}, {}
    for name, fn in fns.items():
        try:
            for _ in range(3):
                fn()
            torch.cuda.synchronize()
            live[name] = fn
        except Exception as exc:  # noqa: BLE001 - reported in its row
            out[name] = exc
    host: dict = {n: [] for n in live}
    gpu: dict = {n: [] for n in live}
    names = list(live)
    with _no_gc():
        _rounds(live, names, rounds, calls, host, gpu)
    out.update({n: (statistics.median(host[n]), statistics.median(gpu[n])) for n in live})
    return out


class _no_gc:
    """Python's garbage collector off while timing, as ``timeit`` does: a collection of the older
    generations walks every object of the process (torchao's and triton's included), a ms or
    more, and lands in whichever loop tips its counter (``--gc`` leaves it on)."""

    off = True  # --gc: leave it on

    def __enter__(self):
        gc.collect()
        self.was = gc.isenabled()
        if self.off:
            gc.disable()

    def __exit__(self, *exc):
        if self.was:
            gc.enable()


def _rounds(live, names, rounds, calls, host, gpu) -> None:
    clock = Clock(torch.device("cuda", torch.cuda.current_device()), flush=False)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)] if names else []:
            seconds, issue = clock.batch(live[name], calls)
            host[name].append(issue / calls)
            gpu[name].append(seconds / calls)


def graph_time(fn, calls: int = 20) -> float | None:
    """GPU s per call of ``fn`` captured in a CUDA graph and replayed."""
    return Clock(torch.device("cuda", torch.cuda.current_device()), flush=False).graph(fn, calls)


def peers(w_dense: torch.Tensor, block: int) -> dict:
    out = {}
    try:
        from torchao.sparsity.blocksparse import BlockSparseTensor

        ao = BlockSparseTensor.from_dense(w_dense, block)
        out["torchao BlockSparseTensor"] = lambda x: F.linear(x, ao, None)
    except Exception as exc:  # noqa: BLE001 - a peer that is missing or can't run: reported
        out["torchao BlockSparseTensor"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:80]}"
    try:
        from torch.sparse._triton_ops import bsr_dense_mm

        w_bsr = w_dense.to_sparse_bsr((block, block))
        out["torch BSR"] = lambda x: bsr_dense_mm(w_bsr, x.t()).t()
    except Exception as exc:  # noqa: BLE001
        out["torch BSR"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:80]}"
    return out


def python_launch(fn):
    """``fn`` with opforge's launches made from Python, as before the C++ launch path: the native
    tables' entry points set aside for the call (their recipes stay defined, and nothing is
    defined meanwhile) and training through the Python ``autograd.Function`` rather than the C++
    autograd node."""
    from opforge.kernels.block_sparse import native_autograd
    from opforge.kernels.block_sparse import triton_impl as ti

    tables = (ti._NATIVE_FWD, ti._NATIVE_DX, ti._NATIVE_DW)

    def run():
        saved = [t.call for t in tables]
        devices = native_autograd.DEVICES
        for t in tables:
            t.call = None
        native_autograd.DEVICES = ()
        try:
            return fn()
        finally:
            native_autograd.DEVICES = devices
            for t, c in zip(tables, saved):
                t.call = c if c is not None else t.call  # a recipe defined meanwhile keeps its entry point
    return run


def case(tokens, k_in, n_out, block, density, dtype, calls) -> list[dict]:
    from opforge.nn import BlockSparseLinear

    torch.manual_seed(0)
    dev = torch.device("cuda")
    m = BlockSparseLinear(k_in, n_out, density=density, block_shape=(block, block), device=dev, dtype=dtype)
    w_dense = m.to_dense().detach().clone().requires_grad_()
    b_dense = m.bias.detach().clone().requires_grad_()
    x = torch.randn(tokens, k_in, device=dev, dtype=dtype)
    xg = x.clone().requires_grad_()
    dy = torch.randn(tokens, n_out, device=dev, dtype=dtype)
    rows = []

    def timed(op, fns: dict, graph: bool):
        """Rows of one op: the implementations timed side by side, then each one's graph."""
        ok = {k: f for k, f in fns.items() if not isinstance(f, str)}
        got = host_and_gpu(ok, calls)
        for impl, fn in fns.items():
            res = fn if isinstance(fn, str) else got[impl]
            if isinstance(res, Exception):
                res = f"{type(res).__name__}: {str(res).splitlines()[0][:80]}"
            if isinstance(res, str):
                rows.append({"op": op, "impl": impl, "error": res})
                continue
            try:
                g = graph_time(fn) if graph else None
            except Exception as exc:  # noqa: BLE001
                g = None
                print(f"  {impl} {op}: no graph: {type(exc).__name__}: {str(exc).splitlines()[0][:80]}",
                      file=sys.stderr)
            rows.append({"op": op, "impl": impl, "host_s": res[0], "gpu_s": res[1], "graph_s": g})

    with torch.no_grad():
        fwd = {"dense F.linear": lambda: F.linear(x, w_dense, b_dense), "opforge BlockSparseLinear": lambda: m(x),
               "opforge, Python launch": python_launch(lambda: m(x))}
        for name, fn in peers(w_dense.detach(), block).items():
            fwd[name] = fn if isinstance(fn, str) else (lambda fn=fn: fn(x))
        timed("fwd", fwd, graph=True)

    def dense_step():
        F.linear(xg, w_dense, b_dense).backward(dy)

    def sparse_step():
        m(xg).backward(dy)

    tiny = torch.ones(1, device=dev, requires_grad=True)
    one = torch.ones(1, device=dev)

    def floor_step():  # autograd's own host cost: one node of one element
        (tiny * 2).backward(one)

    timed("fwd+bwd", {"dense F.linear": dense_step, "opforge BlockSparseLinear": sparse_step,
                      "opforge, Python launch": python_launch(sparse_step),
                      "floor: autograd, 1 element": floor_step}, graph=True)
    for r in rows:
        r.update(tokens=tokens, shape=f"{k_in}x{n_out}", block=block, density=round(m.layout.density, 4),
                 dtype=str(dtype).replace("torch.", ""))
    return rows


def fmt(s):
    return "-" if s is None else f"{s * 1e6:.1f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--tokens", default="16,2048,8192")
    ap.add_argument("--shape", default="4096x4096", help="in x out")
    ap.add_argument("--block", type=int, default=64)
    ap.add_argument("--densities", default="0.5,0.25,0.1")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--json", metavar="FILE")
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--gc", action="store_true", help="leave Python's garbage collector on while timing")
    args = ap.parse_args()
    _no_gc.off = not args.gc
    if not torch.cuda.is_available():
        sys.exit("bench/block_sparse_calls.py needs a CUDA GPU")
    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    from _table import show

    k_in, n_out = (int(v) for v in args.shape.split("x"))
    info = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "gpu": torch.cuda.get_device_name(),
            "torch": torch.__version__, "python": platform.python_version(), "cpu": platform.processor()}
    try:
        import triton
        info["triton"] = triton.__version__
    except ImportError:
        pass
    rows = []
    for tokens in (int(t) for t in args.tokens.split(",")):
        for density in (float(d) for d in args.densities.split(",")):
            print(f"  T={tokens} density {density}", file=sys.stderr, flush=True)
            rows += case(tokens, k_in, n_out, args.block, density, DTYPES[args.dtype], args.calls)
    dense = {(r["tokens"], r["density"], r["op"]): r for r in rows if r["impl"] == "dense F.linear"}
    table = []
    for r in rows:
        d = dense[(r["tokens"], r["density"], r["op"])]
        ok = "error" not in r
        vs_host = r["host_s"] / d["host_s"] if ok else None
        vs_gpu = d["gpu_s"] / r["gpu_s"] if ok else None
        vs_graph = d["graph_s"] / r["graph_s"] if ok and r.get("graph_s") and d.get("graph_s") else None
        r.update(host_vs_dense=vs_host, speedup_back_to_back=vs_gpu, speedup_graph=vs_graph)
        table.append([str(r["tokens"]), f"{r['density']:.2f}", r["op"], r["impl"],
                      fmt(r.get("host_s")) if ok else r["error"], fmt(r.get("gpu_s")), fmt(r.get("graph_s")),
                      f"{vs_host:.2f}×" if vs_host else "-", f"{vs_gpu:.2f}×" if vs_gpu else "-",
                      f"{vs_graph:.2f}×" if vs_graph else "-"])
    show(f"BlockSparseLinear calls, {args.dtype} {args.shape} block {args.block} on {info['gpu']}, "
         f"torch {info['torch']}, triton {info.get('triton')}, {info['date']}",
         ["T", "density", "op", "impl", "host µs", "GPU µs b2b", "graph µs", "host / dense", "speedup b2b",
          "speedup graph"], table, left=4, markdown=args.markdown)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"info": info, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
