"""Fused bias + activation (StyleGAN2's ``bias_act``): eager torch, torch.compile of the same
expression, opforge's public op and each opforge variant, against a device-to-device copy of the
same bytes (the bandwidth ceiling).

Usage::

    .venv/bin/python bench/bias_act.py [--device cuda|cpu] [--dtype fp32,fp16,bf16] [--shapes 256x512x64x64 4x512x8x8]
        [--act lrelu] [--clamp 256] [--layout contiguous|channels_last] [--mode fwd,fwdbwd] [--no-compile]
        [--quick] [--markdown] [--json out.json]

What it runs (one process), per shape and dtype, each in forward ("fwd") and forward + backward ("fwd+bwd"):

* The case: ``y = clamp(act(x + b) * gain, -clamp, clamp)``, ``b`` along dim 1 of an NCHW tensor
  (``--layout channels_last``: NHWC in memory). Default StyleGAN2's: lrelu, alpha 0.2, gain sqrt(2),
  clamp 256. ``x``, ``dy`` ~ N(0, 1), ``b`` ~ 0.1 N(0, 1), all in the dtype benchmarked.
* eager: what a PyTorch user writes, ``F.leaky_relu(x + b.view(1, -1, 1, 1), 0.2) * gain`` then
  ``.clamp(-c, c)`` (the matching ``torch.nn.functional`` call for the other activations).
  torch.compile: ``torch.compile`` of that same function, default mode, compiled afresh for each
  shape and dtype (``torch._dynamo.reset()``) and warmed up before any timing; the first call of
  each mode (the compile) is timed apart (inductor's on-disk cache can shorten it on a re-run). fwd+bwd: ``x`` and ``b`` are leaves that require grad,
  and one call is ``x.grad = b.grad = None; y = f(x, b); y.backward(dy)``.
* opforge (op): ``opforge.ops.bias_act`` with autograd (the same fwd+bwd call), what users
  call: its ``torch.library`` dispatch is in the time. opforge <variant>: each variant that
  loads here, forced (``dispatch.implementation(device, name)``), called through the kernel
  contract: ``forward``, then ``backward`` given ``y`` or ``x`` as the activation needs
  (``Activation.ref_for``), ``need_db`` true. A variant that fails to load, or raises on its
  first call, is left out for the rest of the run, with why.
* pybind11 binding (floor), CUDA only: a plain pybind11 module over the CUDA variant's own
  kernels (``bench/csrc/bias_act_pybind.cpp``, built by ``opforge.load``; ``--no-pybind`` leaves
  it out): no op registry, no autograd, the output allocated in C++. fwd: its ``forward``;
  fwd+bwd: ``forward`` then ``backward`` (dx and db), as the contract rows. The floor of a
  call's host cost with torch's tensors (contiguous layout only).
* copy: ``dst.copy_(src)`` over x's dtype, shape and layout: reads N and writes N elements.
  clone: ``src.clone()``, the same into a new tensor, as every out-of-place op writes: on the CPU
  the fresh pages' first-touch faults (torch's CPU allocator gives large blocks back to the OS)
  cost more than the copy itself; on a GPU the caching allocator makes it a copy.
* Checked before timing: every row's y (fwd) or dx and db (fwd+bwd) against eager's, by
  ||out - ref|| / ||ref|| (fp32 1e-4, fp16 5e-3, bf16 3e-2) and finiteness; a miss is printed
  as a WARNING and the row is marked, then timed anyway.

How it times: the rows of one table (a shape, dtype and mode) live side by side. Each gets W
warm-up calls, then R rounds, the rows in a rotating order each round (a noisy neighbour hits
all alike); in a round, a row runs a batch of k calls, k set per row from a trial batch so that
a batch lasts about 2 ms on a GPU (10 ms on the CPU; --quick: a quarter, R 3, W 2): per-call
time = batch / k, reported as the median (min-max) of R; on a GPU, with the host's time to
issue a call beside it (perf_counter around the batch, no sync inside), the median of R. GPU: the device is synchronized and L2
flushed (a buffer of twice its size zeroed) before each batch, which is timed with CUDA events,
so every row starts from the same cache state (without the flush, a row that follows eager pays
for eager's dirty lines), and a row bound by its launch cost (small shapes) is timed at the
rate the host can feed the GPU. When x and dy together fit in the cache (GPU: under 3x its L2; CPU:
under 4x the L2 of the threads used), the calls cycle over several input sets (x, b, dy, and
copy's dst) that together exceed that, so no call finds its inputs left in cache by the
last one (``--no-rotate``: one set). CUDA, with rotation: also "(graph)" rows, one CUDA graph
of one call per input set, replayed (fwd: eager, torch.compile's compiled function, the op and
the variants; fwd+bwd: the variants' contract calls): the GPU's time alone, launch costs gone.
The rows without a graph on small shapes are mostly the host's launch and Python cost.

Bytes (the least traffic): fwd reads x and b and writes y; fwd+bwd adds the backward's reads of
dy and of y or x (none for linear without a clamp), and its writes of dx and db. GB/s = bytes /
median time; '% copy' = GB/s / the copy's GB/s (copy: 2 x N elements). Ratios are the peer's
median time / this row's: > 1 means faster than eager / torch.compile.

Targets (issue): CUDA: large shapes' forward >= 95% of copy bandwidth; fwd+bwd >= torch.compile
(1.0x); small shapes >= 2x torch.compile. CPU: >= 3x eager for large shapes (2 cores here).
Large: >= 2**24 elements; small: <= 2**20.
"""
from __future__ import annotations

import argparse
import datetime
import gc
import glob
import importlib.util
import json
import math
import os
import statistics
import sys
import time
from dataclasses import dataclass

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch.nn.functional as F
from _table import show  # noqa: E402  (bench/, beside this script)

from opforge.bench.timing import Clock, host_loop, summary  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DTYPES = {"fp32": torch.float32, "float32": torch.float32, "float": torch.float32,
          "fp16": torch.float16, "float16": torch.float16, "half": torch.float16,
          "bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp64": torch.float64, "float64": torch.float64}
SHORT = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.float64: "fp64"}
TOL = {torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 3e-2, torch.float64: 1e-10}
TARGETS = {"cuda": {"large_fwd_pct_copy": 95.0, "fwdbwd_x_compile": 1.0, "small_x_compile": 2.0},
           "cpu": {"large_x_eager": 3.0}}
LARGE, SMALL = 1 << 24, 1 << 20
MODES = {"fwd": "forward", "fwdbwd": "forward + backward"}
MAX_SETS = 512
EAGER, COMPILE, OP, COPY, CLONE = "eager", "torch.compile", "opforge (op)", "copy", "clone"
PYBIND = "pybind11 binding (floor)"


def say(msg: str) -> None:
    print(f"  {msg}", file=sys.stderr, flush=True)


def one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


# --- the activations: opforge's table (pure data), loaded from its file if the package does not import


def activations():
    try:
        from opforge.kernels.bias_act import activations as mod
    except Exception:  # noqa: BLE001 - the package may be mid-change; the table itself has no imports
        path = os.path.join(ROOT, "opforge", "kernels", "bias_act", "activations.py")
        spec = importlib.util.spec_from_file_location("_bench_bias_act_activations", path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod  # dataclasses looks the module up
        spec.loader.exec_module(mod)
    return mod


def torch_act(name: str, alpha: float):
    """The torch.nn.functional call a user would write for ``name``."""
    return {"linear": lambda v: v, "relu": F.relu, "lrelu": lambda v: F.leaky_relu(v, alpha),
            "tanh": torch.tanh, "sigmoid": torch.sigmoid, "elu": lambda v: F.elu(v, alpha), "selu": F.selu,
            "softplus": F.softplus, "swish": F.silu, "gelu": F.gelu,
            "gelu_tanh": lambda v: F.gelu(v, approximate="tanh")}[name]


def eager_fn(act: str, alpha: float, gain: float, clamp: float | None, ndim: int, dim: int):
    """``y = act(x + b.view(1, -1, 1, 1)) * gain; y = y.clamp(-c, c)``: the eager peer (and what torch.compile gets)."""
    fn, shape = torch_act(act, alpha), tuple(-1 if i == dim else 1 for i in range(ndim))

    def bias_act_eager(x, b):
        y = fn(x + b.view(shape))
        if gain != 1:
            y = y * gain
        if clamp is not None:
            y = y.clamp(-clamp, clamp)
        return y
    return bias_act_eager


# --- inputs


@dataclass
class Inputs:
    x: torch.Tensor
    b: torch.Tensor
    dy: torch.Tensor
    xg: torch.Tensor
    """x as a leaf that requires grad (same storage)."""
    bg: torch.Tensor
    dst: torch.Tensor
    """copy's destination."""


def make_sets(shape, dtype, layout: str, device: torch.device, n: int, dim: int) -> list[Inputs]:
    torch.manual_seed(0)
    fmt = torch.channels_last if layout == "channels_last" else torch.contiguous_format
    out = []
    for _ in range(n):
        x = torch.randn(shape, device=device, dtype=dtype).contiguous(memory_format=fmt)
        b = (0.1 * torch.randn(shape[dim], device=device)).to(dtype)
        dy = torch.randn(shape, device=device, dtype=dtype).contiguous(memory_format=fmt)
        out.append(Inputs(x, b, dy, x.detach().requires_grad_(), b.detach().requires_grad_(), torch.empty_like(x)))
    return out


def cache_target(device: torch.device, threads: int) -> tuple[int, str]:
    """Bytes the rotating input sets must exceed together, and what that is."""
    if device.type == "cuda":
        l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 50 << 20) or (50 << 20)
        return 3 * l2, f"3x L2 ({l2 >> 20} MiB)"
    l2 = cache_size(2)
    return 4 * l2 * threads, f"4x L2 ({l2 >> 10} KiB) x {threads} threads"


def cache_size(level: int) -> int:
    """Bytes of CPU 0's cache of that level (sysfs), 2 MiB if unknown."""
    for d in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*"):
        try:
            with open(f"{d}/level") as f, open(f"{d}/type") as t, open(f"{d}/size") as s:
                if int(f.read()) == level and t.read().strip() in ("Unified", "Data"):
                    text = s.read().strip()
                    return int(text[:-1]) * {"K": 1 << 10, "M": 1 << 20}.get(text[-1], 1) if text[-1].isalpha() \
                        else int(text)
        except (OSError, ValueError):
            continue
    return 2 << 20


# --- timing


@dataclass
class Row:
    run: object
    """run(i) -> outputs, on input set i % n (a graph row: i is ignored)."""
    calls: int = 1
    """Calls of the op per run (a graph replays one per input set)."""


def cells(rows: dict[str, Row], clock: Clock, warmup: int, rounds: int, target_s: float, max_k: int) -> dict:
    """Times the rows of one table together (the module doc says how); {name: result}."""
    state = {}
    for name, row in rows.items():
        for i in range(warmup):
            row.run(i)
        trial = 3 if max_k > 1 else 1
        est = clock.batch(row.run, trial, start=warmup)[0] / trial
        k = max(1, min(max_k, round(target_s / max(est, 1e-9))))
        state[name] = [row, k, warmup + trial, [], []]
    names = list(rows)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            st = state[name]
            row, k = st[0], st[1]
            seconds, host = clock.batch(row.run, k, start=st[2])
            st[3].append(seconds / (k * row.calls))
            if host is not None:
                st[4].append(host / (k * row.calls))
            st[2] += k
    out = {}
    for name, (row, k, _, runs, hosts) in state.items():
        out[name] = {**summary(runs), "calls_per_batch": k * row.calls,
                     "host_median_s": statistics.median(hosts) if hosts else None}
    return out


def graphed(run, n: int) -> Row:
    """One CUDA graph of ``run`` over the n input sets (warmed up on a side stream first), as a row."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i in range(min(n, 3)):
            run(i)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(n):
            run(i)
    torch.cuda.synchronize()
    return Row(lambda i: g.replay(), calls=n)


# --- checks


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    if out.shape != ref.shape:
        return math.inf
    o, r = out.detach().float(), ref.detach().float()
    if not bool(torch.isfinite(o).all()):
        return math.inf
    den = r.norm().item()
    return (o - r).norm().item() / (den if den > 0 else 1.0)


def verify(outs, refs, dtype) -> dict:
    outs = outs if isinstance(outs, tuple) else (outs,)
    refs = refs if isinstance(refs, tuple) else (refs,)
    errs = [rel_err(o, r) for o, r in zip(outs, refs)]
    return {"rel_err": errs, "ok": all(e <= TOL[dtype] for e in errs), "tol": TOL[dtype]}


# --- the rows of one case


def traffic(numel: int, channels: int, es: int, bs: int, ref: str, mode: str) -> int:
    fwd = 2 * numel * es + channels * bs
    return fwd if mode == "fwd" else fwd + (3 if ref else 2) * numel * es + channels * bs


def autograd_run(f, sets: list[Inputs]):
    n = len(sets)

    def run(i):
        s = sets[i % n]
        s.xg.grad = None
        s.bg.grad = None
        f(s.xg, s.bg).backward(s.dy)
        return s.xg.grad, s.bg.grad
    return run


def forward_run(f, sets: list[Inputs]):
    n = len(sets)
    return lambda i: f(sets[i % n].x, sets[i % n].b)


def kernel_runs(impl, sets: list[Inputs], dim, act, alpha, gain, clamp, ref):
    """fwd and fwd+bwd through the kernel contract (reference.py), no autograd."""
    n = len(sets)

    def fwd(i):
        s = sets[i % n]
        return impl.forward(s.x, s.b, dim, act, alpha, gain, clamp)

    def fwdbwd(i):
        s = sets[i % n]
        y = impl.forward(s.x, s.b, dim, act, alpha, gain, clamp)
        return impl.backward(s.dy, s.x if ref == "x" else None, s.b, y if ref == "y" else None, dim, act, alpha,
                             gain, clamp, True)
    return fwd, fwdbwd


def pybind_floor(device: torch.device):
    """The issue's floor peer: a plain pybind11 module over opforge's bias_act CUDA kernels
    (``bench/csrc/bias_act_pybind.cpp``: torch/extension.h, no op registry, no autograd), built by
    ``opforge.load`` (torch's ``load`` signature) from the variant's own ``.cu`` sources."""
    import opforge

    csrc = os.path.join(os.path.dirname(opforge.__file__), "kernels", "bias_act", "csrc")
    common = os.path.join(os.path.dirname(opforge.__file__), "kernels", "common", "csrc")
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "csrc")
    sources = [os.path.join(here, "bias_act_pybind.cpp")] + [
        os.path.join(csrc, f) for f in ("bias_act_cuda_launch.cu", "bias_act_cuda_f32.cu", "bias_act_cuda_f16.cu",
                                        "bias_act_cuda_bf16.cu")]
    return opforge.load("bias_act_pybind_floor", sources, extra_include_paths=[csrc, common],
                        extra_cflags=["-O2"], extra_cuda_cflags=["-O3"])


class PybindFloor:
    """The kernel contract's ``forward`` and ``backward`` (``reference.py``) over the pybind11
    floor module, so ``kernel_runs`` drives it as it drives a variant (the same arguments, the
    module's own per-call work: contiguous tensors only, no autograd)."""

    def __init__(self, mod):
        from opforge.kernels.bias_act.activations import lookup
        from opforge.kernels.bias_act.layout import clamp_as_stored

        self.mod, self.lookup, self.clamp_as_stored = mod, lookup, clamp_as_stored

    def forward(self, x, b, dim, act, alpha, gain, clamp):
        return self.mod.forward(x, b, dim, self.lookup(act).index, alpha, gain, -1.0 if clamp is None else clamp)

    def backward(self, dy, x, b, y, dim, act, alpha, gain, clamp, need_db):
        c = -1.0 if clamp is None else clamp
        if y is not None:  # ref y: the clamp as y's dtype holds it
            return self.mod.backward(dy, y, b, dim, self.lookup(act).index, 1, alpha, gain, c,
                                     self.clamp_as_stored(clamp, y.dtype))
        return self.mod.backward(dy, x, b, dim, self.lookup(act).index, 2, alpha, gain, c, -1.0)


def opforge_setup(device: torch.device, only: list[str] | None) -> dict:
    """The opforge op, its default variant's name, and each variant that loads here (forced)."""
    kind = device.type
    got: dict = {"variants": {}, "skipped": {}, "broken": {}, "op": None, "op_variant": None}
    try:
        from opforge.kernels.bias_act import BiasActLoader, dispatch
        from opforge.ops.bias_act import bias_act
    except Exception as exc:  # noqa: BLE001 - reported; the peers run without it
        got["error"] = f"opforge's bias_act does not import: {one_line(exc)}"
        return got
    loader = BiasActLoader()
    try:
        got["op_variant"] = loader.load(device=kind).name
        got["op"] = bias_act
    except Exception as exc:  # noqa: BLE001
        got["skipped"][OP] = one_line(exc)
    for c in loader.candidates(device=kind):
        if not c.extension.serves(kind) or (only and c.name not in only):
            continue
        if not c.decision:
            got["skipped"][c.name] = c.decision.reason
            continue
        say(f"loading {c.name} (may build)")
        try:
            got["variants"][c.name] = dispatch.implementation(device, c.name)
        except Exception as exc:  # noqa: BLE001 - one line, then on without it
            got["skipped"][c.name] = one_line(exc)
    return got


def run_case(args, dev: torch.device, shape, dtype, of: dict, spec, clock: Clock) -> dict:
    dim, act, alpha, gain, clamp = 1, spec.name, args.alpha, args.gain, args.clamp
    ref = spec.ref_for(alpha, clamp)
    numel, channels, es = math.prod(shape), shape[dim], torch.empty(0, dtype=dtype).element_size()
    target, target_what = cache_target(dev, args.threads)
    set_bytes = 2 * numel * es
    n = 1 if not args.rotate or set_bytes >= target else min(MAX_SETS, math.ceil(target / set_bytes))
    label = "x".join(map(str, shape))
    case: dict = {"shape": list(shape), "label": label, "dtype": SHORT[dtype], "numel": numel, "input_sets": n,
                  "rotate_target": target_what if n > 1 else None, "compile_s": {}, "tables": {}, "checks": {},
                  "skipped": {}}
    say(f"{label} {SHORT[dtype]}: {n} input set(s)")
    sets = make_sets(shape, dtype, args.layout, dev, n, dim)
    f = eager_fn(act, alpha, gain, clamp, len(shape), dim)
    cf = None
    if args.compile:
        torch._dynamo.reset()
        cf = torch.compile(f)
    op = of.get("op")
    op_alpha = alpha if spec.uses_alpha else None
    opf = None if op is None else (lambda x, b: op(x, b, dim=dim, act=act, alpha=op_alpha, gain=gain, clamp=clamp))
    kernels = {name: kernel_runs(impl, sets, dim, act, alpha, gain, clamp, ref) for name, impl in of["variants"].items()}
    floor = None
    if of.get("pybind") is not None and ref in ("x", "y") and dtype in (torch.float32, torch.float16, torch.bfloat16):
        if all(s.x.is_contiguous() for s in sets):
            floor = kernel_runs(PybindFloor(of["pybind"]), sets, dim, act, alpha, gain, clamp, ref)
        else:
            case["skipped"][PYBIND] = "takes contiguous tensors only"
    quick = args.quick
    max_k = 1000 if dev.type == "cuda" else 200
    target_s = (2e-3 if dev.type == "cuda" else 10e-3) / (4 if quick else 1)
    for mode in args.modes:
        rows: dict[str, Row] = {COPY: Row(lambda i: sets[i % n].dst.copy_(sets[i % n].x)),
                                CLONE: Row(lambda i: sets[i % n].x.clone())}
        peers = {EAGER: f}
        if cf is not None:
            peers[COMPILE] = cf
        if opf is not None:
            peers[OP] = opf
        for name, fn in peers.items():
            if name not in of["broken"]:
                rows[name] = Row(forward_run(fn, sets) if mode == "fwd" else autograd_run(fn, sets))
        for name, (kf, kfb) in kernels.items():
            if f"opforge {name}" not in of["broken"]:
                rows[f"opforge {name}"] = Row(kf if mode == "fwd" else kfb)
        if floor is not None:
            rows[PYBIND] = Row(floor[0] if mode == "fwd" else floor[1])
        # the compile, timed apart: its first call in this mode
        if COMPILE in rows:
            say(f"{label} {SHORT[dtype]} {mode}: torch.compile (first call)")
            try:
                case["compile_s"][mode] = host_loop(rows[COMPILE].run, 1, before=clock.sync, after=clock.sync,
                                                       calls=range(1))
            except Exception as exc:  # noqa: BLE001 - reported, then on without it
                case["skipped"][f"{COMPILE} {mode}"] = one_line(exc)
                say(f"torch.compile failed: {one_line(exc)}")
                del rows[COMPILE]
                cf = None
        # checks against eager, before timing
        expect = rows[EAGER].run(0)
        expect = tuple(t.detach().clone() for t in expect) if isinstance(expect, tuple) else expect.detach().clone()
        checks = case["checks"][mode] = {}
        for name, row in list(rows.items()):
            if name in (COPY, CLONE, EAGER):
                continue
            try:
                got = row.run(0)
            except Exception as exc:  # noqa: BLE001 - a row that raises is left out, saying why
                if name.startswith("opforge"):  # for the rest of the run
                    of["broken"][name] = f"{label} {SHORT[dtype]} {mode}: {one_line(exc)}"
                else:
                    case["skipped"][f"{name} {mode}"] = one_line(exc)
                say(f"{name} {mode} raised, left out: {one_line(exc)}")
                del rows[name]
                continue
            checks[name] = verify(got, expect, dtype)
            if not checks[name]["ok"]:
                say(f"WARNING {label} {SHORT[dtype]} {mode} {name}: rel err {checks[name]['rel_err']} "
                    f"> {TOL[dtype]} (vs eager)")
            del got
        del expect
        gc.collect()
        # CUDA graphs, with rotation (small shapes): forward rows, and the variants' fwd+bwd
        if dev.type == "cuda" and n > 1 and args.graphs:
            graphable = [EAGER, COMPILE, OP] if mode == "fwd" else []
            graphable += [k for k in rows if (k.startswith("opforge ") and k != OP) or k == PYBIND]
            for name in graphable:
                if name not in rows:
                    continue
                try:
                    rows[f"{name} (graph)"] = graphed(rows[name].run, n)
                except Exception as exc:  # noqa: BLE001
                    case["skipped"][f"{name} (graph) {mode}"] = one_line(exc)
                    say(f"{name} {mode}: no graph: {one_line(exc)}")
        say(f"{label} {SHORT[dtype]} {mode}: timing {', '.join(rows)}")
        res = cells(rows, clock, args.warmup, args.rounds, target_s, max_k)
        del rows
        nbytes = traffic(numel, channels, es, es, ref, mode)
        copy = res[COPY]
        copy_gbs = 2 * numel * es / copy["median_s"] / 1e9
        for name, r in res.items():
            r["bytes"] = 2 * numel * es if name in (COPY, CLONE) else nbytes
            r["gbs"] = r["bytes"] / r["median_s"] / 1e9
            r["pct_copy"] = 100 * r["gbs"] / copy_gbs
            base = name.removesuffix(" (graph)")
            r["ok"] = checks.get(base, {"ok": True})["ok"]
            for key, peer in (("x_eager", EAGER), ("x_compile", COMPILE)):
                r[key] = res[peer]["median_s"] / r["median_s"] if peer in res and name not in (COPY, CLONE) else None
        case["tables"][mode] = {"bytes": nbytes, "copy_gbs": copy_gbs, "floor_s": nbytes / (copy_gbs * 1e9),
                                "rows": res}
        gc.collect()
    return case


# --- machine facts and report


def machine_info(dev: torch.device) -> dict:
    try:
        with open("/proc/cpuinfo") as f:  # Linux only
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "unknown")
    except OSError:
        cpu = "unknown"
    m = {"cpu": cpu, "cpus": os.cpu_count(), "affinity": len(os.sched_getaffinity(0)),
         "threads": torch.get_num_threads(), "torch": torch.__version__, "python": sys.version.split()[0],
         "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
         "l2_bytes": cache_size(2), "llc_bytes": max((cache_size(lv) for lv in (3, 2)), default=0)}
    try:
        import triton
        m["triton"] = triton.__version__
    except Exception:  # noqa: BLE001
        m["triton"] = None
    if dev.type == "cuda":
        p = torch.cuda.get_device_properties(dev)
        m.update(gpu=p.name, gpu_mem_gib=p.total_memory / 2**30, sms=p.multi_processor_count,
                 capability=f"{p.major}.{p.minor}", gpu_l2_mib=getattr(p, "L2_cache_size", 0) / 2**20,
                 cuda=torch.version.cuda)
    return m


def fmt_t(s: float) -> str:
    return f"{s * 1e6:.1f} µs" if s < 1e-3 else f"{s * 1e3:.3f} ms"


def cell_t(r: dict) -> str:
    """median (min-max), the range in the median's unit."""
    scale, digits = (1e6, 1) if r["median_s"] < 1e-3 else (1e3, 3)
    cell = f"{fmt_t(r['median_s'])} ({r['min_s'] * scale:.{digits}f}-{r['max_s'] * scale:.{digits}f})"
    return cell + (f", host {fmt_t(r['host_median_s'])}" if r.get("host_median_s") is not None else "")


def x(v) -> str:
    return "-" if v is None else f"{v:.2f}x"


def size_class(numel: int) -> str | None:
    return "large" if numel >= LARGE else "small" if numel <= SMALL else None


def targets(res: dict) -> list[str]:
    """One line per case and mode: each target for the opforge op and its best variant row."""
    goals, lines = TARGETS[res["device"]], []
    for case in res["cases"]:
        size = size_class(case["numel"])
        for mode, table in case["tables"].items():
            rows = table["rows"]
            checks: list[tuple[str, str, float]] = []  # (what, key, goal)
            if res["device"] == "cuda":
                if size == "large" and mode == "fwd":
                    checks.append(("% copy", "pct_copy", goals["large_fwd_pct_copy"]))
                if mode == "fwdbwd":
                    checks.append(("vs compile", "x_compile", goals["fwdbwd_x_compile"]))
                if size == "small":
                    checks.append(("vs compile", "x_compile", goals["small_x_compile"]))
            elif size == "large":
                checks.append(("vs eager", "x_eager", goals["large_x_eager"]))
            if not checks:
                continue
            variants = [k for k in rows if k.startswith("opforge ") and k != OP and not k.endswith("(graph)")]
            best = min(variants, key=lambda k: rows[k]["median_s"], default=None)
            for name in dict.fromkeys(k for k in (OP, best) if k in rows):
                r = rows[name]
                parts = []
                for key, (what, goal) in {k: (w, g) for w, k, g in sorted(checks, key=lambda c: c[2])}.items():
                    v = r.get(key)
                    if v is None:
                        parts.append(f"{what} n/a (no peer)")
                        continue
                    shown = f"{v:.0f}%" if key == "pct_copy" else f"{v:.2f}x"
                    goal_s = f"{goal:.0f}%" if key == "pct_copy" else f"{goal}x"
                    parts.append(f"{what} {shown} (>= {goal_s}) {'met' if v >= goal else 'MISSED'}")
                lines.append(f"  {case['label']} {case['dtype']} {MODES[mode]}, {name}: " + "; ".join(parts))
    return lines


def report(res: dict) -> None:
    m, a = res["machine"], res["args"]
    gpu = (f"{m['gpu']} ({m['gpu_mem_gib']:.0f} GiB, {m['sms']} SMs, L2 {m['gpu_l2_mib']:.0f} MiB, sm_"
           f"{m['capability'].replace('.', '')}) · CUDA {m['cuda']} · ") if res["device"] == "cuda" else ""
    print(f"{gpu}{m['cpu']} · {m['threads']} threads (torch.get_num_threads(); {m['affinity']} CPUs usable, "
          f"{m['cpus']} online) · torch {m['torch']} · triton {m['triton'] or 'n/a'} · Python {m['python']} · "
          f"{m['date_utc']}")
    clamp = "none" if a["clamp"] is None else f"{a['clamp']:g}"
    print(f"bias_act: act={a['act']} alpha={a['alpha']:g} gain={a['gain']:.4g} clamp={clamp}, bias along dim 1, "
          f"{a['layout']}; {a['rounds']} rounds after {a['warmup']} warm-up calls, interleaved; times are per call, "
          f"median (min-max); GB/s at the least traffic; '% copy' = GB/s / copy's GB/s; vs = peer time / this time")
    of = res["opforge"]
    if "error" in of:
        print(f"opforge left out: {of['error']}")
    else:
        print(f"opforge (op) uses {of['op_variant'] or 'n/a'}; variants timed: {', '.join(of['variants']) or 'none'}")
    for name, why in of["skipped"].items():
        print(f"  left out: {name}: {why}")
    for name, why in of["broken"].items():
        print(f"  left out: {name}: raised on its first call, at {why}")
    head = ["shape", "dtype", "implementation", "time", "GB/s", "% copy", "vs eager", "vs compile"]
    for mode in a["modes"]:
        rows = []
        for case in res["cases"]:
            table = case["tables"].get(mode)
            if table is None:
                continue
            sets = f" ({case['input_sets']} sets)" if case["input_sets"] > 1 else ""
            for name, r in table["rows"].items():
                flag = "" if r["ok"] else " MISMATCH"
                rows.append([case["label"] + sets, case["dtype"], name + flag, cell_t(r), f"{r['gbs']:.0f}",
                             f"{r['pct_copy']:.0f}%", x(r["x_eager"]), x(r["x_compile"])])
        show(f"bias_act {MODES[mode]} ({res['device']})", head, rows, left=3, markdown=a["markdown"])
    comp = [(c["label"], c["dtype"], c["compile_s"]) for c in res["cases"] if c["compile_s"]]
    if comp:
        print("\ntorch.compile, first call (compile + run): " + "; ".join(
            f"{lab} {dt} " + ", ".join(f"{k} {v:.1f} s" for k, v in cs.items()) for lab, dt, cs in comp))
    bad = [(c["label"], c["dtype"], mode, name, ck) for c in res["cases"] for mode, d in c["checks"].items()
           for name, ck in d.items() if not ck["ok"]]
    for lab, dt, mode, name, ck in bad:
        print(f"WARNING: {lab} {dt} {mode} {name}: output differs from eager: rel err "
              f"{', '.join(f'{e:.2e}' for e in ck['rel_err'])} > {ck['tol']:g}")
    if not bad:
        print("\nchecks: every timed row matched eager (rel err within "
              + ", ".join(f"{SHORT[d]} {t:g}" for d, t in TOL.items() if SHORT[d] in {c['dtype'] for c in res['cases']})
              + ")")
    for c in res["cases"]:
        for what, why in c["skipped"].items():
            print(f"  {c['label']} {c['dtype']}: left out {what}: {why}")
    goals = TARGETS[res["device"]]
    lines = targets(res)
    print(f"\nTargets ({res['device']}): " + ", ".join(f"{k} {v}" for k, v in goals.items())
          + f" (large: >= {LARGE} elements, small: <= {SMALL})")
    print("\n".join(lines) if lines else "  (no case here has a target)")


# --- CLI


def listed(values: list[str] | None) -> list[str]:
    return [v.strip() for item in values or [] for v in item.split(",") if v.strip()]


def parse_shape(text: str) -> tuple[int, ...]:
    shape = tuple(int(v) for v in text.lower().split("x"))
    if len(shape) < 2 or min(shape) < 1:
        raise argparse.ArgumentTypeError(f"shape {text!r}: want N x C x ..., e.g. 256x512x64x64")
    return shape


def main() -> None:
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--device", choices=("cpu", "cuda"), help="default: cuda if available, else cpu")
    ap.add_argument("--dtype", action="append", metavar="LIST",
                    help="fp32, fp16, bf16 (repeat or comma list; default fp32,fp16,bf16 on cuda, fp32 on cpu)")
    ap.add_argument("--shapes", "--shape", nargs="+", action="extend", metavar="NxCxHxW",
                    help="default 256x512x64x64 4x512x8x8 on cuda, 16x512x64x64 4x512x8x8 on cpu; bias along dim 1")
    ap.add_argument("--act", default="lrelu", help="activation (default lrelu): linear, relu, lrelu, tanh, sigmoid, "
                    "elu, selu, softplus, swish, gelu, gelu_tanh")
    ap.add_argument("--alpha", type=float, help="lrelu slope / elu alpha (default: the activation's, 0.2 for lrelu)")
    ap.add_argument("--gain", type=float, help="default: the activation's (sqrt(2) for relu, lrelu, swish; else 1)")
    ap.add_argument("--clamp", default="256", help="clamp (default 256, StyleGAN2's); 'none' for no clamp")
    ap.add_argument("--layout", choices=("contiguous", "channels_last"), default="contiguous")
    ap.add_argument("--mode", action="append", metavar="LIST", help="fwd, fwdbwd (default both)")
    ap.add_argument("--variants", action="append", metavar="LIST",
                    help="only these opforge variants (e.g. bias_act_cuda,bias_act_triton; default every one here)")
    ap.add_argument("--no-compile", dest="compile", action="store_false", help="leave torch.compile out (slow on CPU)")
    ap.add_argument("--no-rotate", dest="rotate", action="store_false",
                    help="one input set even when it fits in the cache")
    ap.add_argument("--no-graphs", dest="graphs", action="store_false", help="no CUDA-graph rows")
    ap.add_argument("--no-pybind", dest="pybind", action="store_false",
                    help="leave out the pybind11 binding of the CUDA kernels (the host-cost floor; built on first use)")
    ap.add_argument("--threads", type=int, help="torch.set_num_threads (default: every usable CPU)")
    ap.add_argument("--warmup", type=int, help="warm-up calls per row (default 5; --quick 2)")
    ap.add_argument("--rounds", type=int, help="timed batches per row (default 20 cuda, 15 cpu; --quick 3)")
    ap.add_argument("--quick", action="store_true", help="few repetitions, for a smoke test")
    ap.add_argument("--markdown", action="store_true", help="tables as markdown (for docs/benchmarks.md)")
    ap.add_argument("--json", metavar="PATH", help="write all results, per-batch times included, as JSON")
    args = ap.parse_args()

    dev = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA device here")
    args.threads = args.threads or len(os.sched_getaffinity(0))
    torch.set_num_threads(args.threads)
    names = listed(args.dtype) or (["fp32", "fp16", "bf16"] if dev.type == "cuda" else ["fp32"])
    if bad := [d for d in names if d not in DTYPES]:
        raise SystemExit(f"--dtype: unknown {bad}; use fp32, fp16, bf16 (or fp64)")
    dtypes = list(dict.fromkeys(DTYPES[d] for d in names))
    shapes = [parse_shape(s) for s in (args.shapes or (
        ["256x512x64x64", "4x512x8x8"] if dev.type == "cuda" else ["16x512x64x64", "4x512x8x8"]))]
    if args.layout == "channels_last" and any(len(s) != 4 for s in shapes):
        raise SystemExit("--layout channels_last needs 4-D shapes")
    args.modes = listed(args.mode) or list(MODES)
    if bad := [m for m in args.modes if m not in MODES]:
        raise SystemExit(f"--mode: unknown {bad}; use fwd, fwdbwd")
    try:
        spec = activations().lookup(args.act)
    except ValueError as exc:
        raise SystemExit(f"--act: {exc}") from None
    args.alpha = spec.default_alpha if args.alpha is None else args.alpha
    args.gain = spec.default_gain if args.gain is None else args.gain
    args.clamp = None if args.clamp.lower() == "none" else float(args.clamp)
    args.warmup = args.warmup if args.warmup is not None else (2 if args.quick else 5)
    args.rounds = args.rounds or (3 if args.quick else 20 if dev.type == "cuda" else 15)

    t0 = time.perf_counter()
    of = opforge_setup(dev, listed(args.variants))
    of["pybind"] = None
    if dev.type == "cuda" and args.pybind and "error" not in of:
        say("building the pybind11 floor peer (may build)")
        try:
            of["pybind"] = pybind_floor(dev)
        except Exception as exc:  # noqa: BLE001 - reported; the run goes on without it
            of["skipped"][PYBIND] = one_line(exc)
    if "error" in of:
        say(of["error"])
    for name, why in of["skipped"].items():
        say(f"left out {name}: {why}")
    clock = Clock(dev)
    res: dict = {"device": dev.type, "machine": machine_info(dev), "targets": TARGETS[dev.type],
                 "args": {"dtypes": [SHORT[d] for d in dtypes], "shapes": [list(s) for s in shapes],
                          "act": spec.name, "alpha": args.alpha, "gain": args.gain, "clamp": args.clamp,
                          "layout": args.layout, "modes": args.modes, "compile": args.compile,
                          "rotate": args.rotate, "graphs": args.graphs, "threads": args.threads,
                          "warmup": args.warmup, "rounds": args.rounds, "quick": args.quick,
                          "markdown": args.markdown},
                 "opforge": {"op_variant": of["op_variant"], "variants": list(of["variants"]),
                             "skipped": of["skipped"], "broken": of["broken"], "pybind_floor": of["pybind"] is not None,
                             **({"error": of["error"]} if "error" in of else {})},
                 "cases": []}
    for shape in shapes:
        for dtype in dtypes:
            res["cases"].append(run_case(args, dev, shape, dtype, of, spec, clock))
            gc.collect()  # the case's inputs, outputs and compiled function go with it
            if dev.type == "cuda":
                torch.cuda.empty_cache()
    res["wall_s"] = time.perf_counter() - t0
    report(res)
    print(f"\nwall time: {res['wall_s']:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2, default=str)


if __name__ == "__main__":
    main()
