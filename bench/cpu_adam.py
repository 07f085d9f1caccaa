"""CPU Adam step time: torch AdamW (default, fused=True), DeepSpeedCPUAdam and opforge's CPUAdam,
against the same run's STREAM-triad bandwidth.

Usage::

    .venv/bin/python bench/cpu_adam.py [--sizes 1M 10M 100M] [--warmup 3] [--steps 10] [--quick] [--json out.json]

How it measures (one process, on torch.get_num_threads() threads):

* Adam: one param of N elements with its grad; each implementation updates its own copy. AdamW
  for all (lr 1e-3, betas 0.9/0.999, eps 1e-8, weight_decay 0.01). The implementations of a
  table live side by side: W warm-up steps each (states allocated and first touched), then S
  rounds of one timed ``step()`` each in a rotating order, so a noisy neighbour hits all of them
  alike; each timed step comes right after an untimed one of its own, so a size that fits in
  cache is timed in cache, as the triad is (``--cold``: without it, so the step finds the
  others' data in the cache). The median (min-max) of S. DeepSpeed's op is JIT-built before any
  timing. torch's default on CPU
  is its single-tensor for-loop. opforge: ``CPUAdam`` (best variant) in the main table, each
  variant that runs here through its kernel (``adam_step_``) in a second one.
* Bytes per element: fp32 reads param, grad, exp_avg, exp_avg_sq and writes param, exp_avg,
  exp_avg_sq: 28 B. bf16-param mode (bf16 param and grad, fp32 states): 22 B; torch fused keeps
  its states in the param's dtype (bf16), so 14 B. GB/s = B/elem x N / median time.
* Triad: ``a = b + s*c`` in fp32 (bench/triad/triad.cpp, built by opforge's engine on the stable
  ABI, AVX-512 or AVX2 by this CPU's flags, OpenMP), its three arrays together as large as Adam's
  fp32 working set (16 B x N), so a size that fits in cache meets a triad that does too. GB/s at
  12 B/element (read b, c; write a: STREAM's convention) is what '% triad' divides by; 16 B/element
  (plus the write-allocate read of a, which ordinary stores really cost) is shown beside it. Also
  reported: a triad on >= 4x the last-level cache (DRAM), and one with non-temporal stores.
* Ratios are the other's median time / this one's: > 1 means faster than torch fused / DeepSpeed.

The profile (``--sweep 100M``): one size, thread counts 1, 2, 4, ... up to the CPU count. At each,
the triad, Adam's memory-traffic floor (``adam_traffic`` in bench/triad/triad.cpp: p += g, m += g,
v += g, i.e. Adam's reads and writes, 28 B/element, with next to no arithmetic), torch fused,
DeepSpeed and opforge's kernel. An Adam step can't beat the floor on the same machine; where
opforge sits near it, the rest of the gap to a target is the memory system, not the kernel.
Huge pages: torch's CPU allocator asks for them when ``THP_MEM_ALLOC_ENABLE=1``; the machine line
says what the kernel's THP setting and that variable were, and how much of the process's
anonymous memory was on huge pages.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import glob
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _table import show as show_table  # noqa: E402  (bench/, beside this script)

from opforge.bench.timing import host_loop, summary  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LR, BETAS, EPS, WD = 1e-3, (0.9, 0.999), 1e-8, 0.01
TARGETS = {"x_fused": 1.3, "x_deepspeed": 1.2, "pct_triad": 85.0}


def parse_size(text: str) -> int:
    """'1M' -> 10**6 elements; 'k' (sysfs cache sizes) means KiB."""
    mult = {"K": 10**3, "M": 10**6, "G": 10**9, "k": 2**10}.get(text[-1], 1)
    return int(float(text[:-1] if mult > 1 else text) * mult)


def say(msg: str) -> None:
    print(f"  {msg}", file=sys.stderr, flush=True)


def timed(step, warmup: int, steps: int) -> dict:
    for _ in range(warmup):
        step()
    return summary([host_loop(step, 1) for _ in range(steps)])


def build_triad():
    """The triad op, built (or found in the cache) by opforge's engine; and the ISA it was built for."""
    from opforge import platform, settings
    from opforge.engine import jit
    from opforge.engine.key import make_spec
    from opforge.engine.progress import Reporter

    cpu = platform.current().cpu
    isa, flags = next((isa, flags) for isa, need, flags in (
        ("avx512", ("avx512f", "avx2", "fma"), ["-mavx512f", "-mavx2", "-mfma"]),
        ("avx2", ("avx2", "fma"), ["-mavx2", "-mfma"]), ("scalar", (), [])) if cpu.has(*need))
    s = settings.current()
    spec = make_spec(s, "bench_triad", [os.path.join(ROOT, "bench", "triad", "triad.cpp")],
                     ["-O3", "-fopenmp", "-DOPFORGE_NS=bench_triad", *flags], None, ["-fopenmp"],
                     [os.path.join(ROOT, "opforge", "kernels", "common", "csrc")],
                     False, False, False, "2.10")
    jit.load_spec(spec, s, None, Reporter(False))
    return torch.ops.bench_triad, isa


def triad(ops, total_bytes: int, warmup: int, steps: int, streaming: bool = False) -> dict:
    n = max(64, total_bytes // 12)  # three fp32 arrays
    a, b, c = torch.zeros(n), torch.rand(n), torch.rand(n)
    res = timed(lambda: ops.triad(a, b, c, 3.0, torch.get_num_threads(), streaming), warmup, steps)
    if not torch.allclose(a[-4096:], b[-4096:] + 3.0 * c[-4096:], rtol=1e-6):
        raise SystemExit("triad: wrong result")
    med = res["median_s"]
    return {"n": n, "mbytes": 12 * n / 1e6, "gbs12": 12 * n / med / 1e9, "gbs16": 16 * n / med / 1e9, **res}


def adam_floor(ops, n: int, warmup: int, steps: int) -> dict:
    """Adam's traffic (read p, g, m, v; write p, m, v) with no real arithmetic: the ceiling."""
    p, g, m, v = torch.rand(n), torch.full((n,), 1e-9), torch.rand(n), torch.rand(n)
    res = timed(lambda: ops.adam_traffic(p, g, m, v, torch.get_num_threads()), warmup, steps)
    return {**res, "gbs": 28 * n / res["median_s"] / 1e9}


def last_level_cache() -> int:
    """Bytes of the largest cache sysfs lists for CPU 0 ("491520K"), 0 if none."""
    sizes = [parse_size(open(f).read().strip().replace("K", "k")) for f in glob.glob(  # noqa: SIM115
        "/sys/devices/system/cpu/cpu0/cache/index*/size")]
    return max(sizes, default=0)


# --- implementations: make(param) -> step(); param has .grad set


def torch_adamw(fused: bool):
    return lambda p: torch.optim.AdamW([p], lr=LR, betas=BETAS, eps=EPS, weight_decay=WD,
                                       **({"fused": True} if fused else {})).step


def deepspeed_adam(p):
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    return DeepSpeedCPUAdam([p], lr=LR, betas=BETAS, eps=EPS, weight_decay=WD, adamw_mode=True,
                            fp32_optimizer_states=True).step


def opforge_adam(p):
    from opforge.optim import CPUAdam

    return CPUAdam([p], lr=LR, betas=BETAS, eps=EPS, weight_decay=WD, adamw_mode=True).step


def opforge_variant(name: str):
    from opforge.kernel_loader import CPUAdamLoader

    k = CPUAdamLoader().load(ext_name=name)

    def make(p):
        data, grad = p.detach(), p.grad
        m, v, t = torch.zeros_like(data, dtype=torch.float32), torch.zeros_like(data, dtype=torch.float32), [0]

        def step():
            t[0] += 1
            k.adam_step_(data, grad, m, v, None, None, LR, *BETAS, EPS, WD, t[0], True, True, False, 1.0, False,
                         torch.get_num_threads())
        return step
    return make


def cells(makes: dict, src: tuple[torch.Tensor, torch.Tensor], dtype, warmup: int, steps: int,
          cold: bool = False) -> dict:
    """Times the implementations of one table together: each gets its own copy of the param and
    grad, W warm-up steps, then S rounds of one timed step each, in a rotating order, so that all
    of them meet the same machine (a noisy neighbour). Hot (the default): each timed step comes
    right after an untimed one of the same implementation, so a size that fits in cache is timed
    in cache, as the triad is; cold: the timed step finds what the others left in the cache. Returns
    {name: result}; an implementation that fails is {"error": ...} (DeepSpeed may; opforge and
    torch must not)."""
    out, live = {}, {}
    with contextlib.redirect_stdout(sys.stderr):  # DeepSpeed prints a banner per optimizer
        for name, make in makes.items():
            p = torch.nn.Parameter(src[0].to(dtype, copy=True))
            p.grad = src[1].to(dtype, copy=True)
            try:
                step = make(p)
                for _ in range(warmup):
                    step()
            except Exception as exc:
                if make is not deepspeed_adam:
                    raise
                out[name] = {"error": f"{type(exc).__name__}: {str(exc).strip()[:2000]}"}
                continue
            live[name] = (p, step, [])
        names = list(live)
        for i in range(steps):
            for name in names[i % len(names):] + names[:i % len(names)]:
                if not cold:
                    live[name][1]()
                live[name][2].append(host_loop(live[name][1], 1))
    for name, (p, _, runs) in live.items():
        if not bool(torch.isfinite(p.detach()[-4096:].float()).all()) or torch.equal(p.detach(), src[0].to(dtype)):
            raise RuntimeError(f"{name}: the param was not updated, or is not finite")
        out[name] = summary(runs)
    del live
    gc.collect()
    return out


def cell(make, src: tuple[torch.Tensor, torch.Tensor], dtype, warmup: int, steps: int) -> dict:
    res = cells({"it": make}, src, dtype, warmup, steps)["it"]
    if "error" in res:
        raise RuntimeError(res["error"])
    return res


def run(args) -> dict:
    from opforge.kernel_loader import CPUAdamLoader

    res: dict = {"machine": machine_info(), "warmup": args.warmup, "steps": args.steps, "cold": args.cold,
                 "targets": TARGETS,
                 "sizes": {}, "deepspeed": {}}
    ops, res["triad_isa"] = build_triad()
    try:
        with contextlib.redirect_stdout(sys.stderr):  # its logger, made at import, then writes to stderr
            import deepspeed
        res["deepspeed"]["version"] = deepspeed.__version__
        say("DeepSpeed: building (or loading) its CPU Adam op before any timing")
        cell(deepspeed_adam, (torch.randn(4096), torch.randn(4096)), torch.float32, 1, 1)
    except Exception as exc:  # noqa: BLE001 - reported, then the bench goes on without it
        res["deepspeed"]["error"] = f"import or build failed: {type(exc).__name__}: {exc}"
    variants = [c.name for c in CPUAdamLoader().candidates() if c.decision]
    res["opforge_variants"], best = variants, CPUAdamLoader().load().name
    llc = res["machine"]["llc_bytes"] = last_level_cache()
    dram_bytes = max(4 * llc, 1 << 30)
    say(f"triad, DRAM ({dram_bytes / 1e6:.0f} MB)")
    res["triad_dram"] = triad(ops, dram_bytes, args.warmup, args.steps)
    res["triad_dram_nt"] = triad(ops, dram_bytes, args.warmup, args.steps, streaming=True)
    fp32_impls = [("torch AdamW default", 28, torch_adamw(False)), ("torch AdamW fused", 28, torch_adamw(True)),
                  ("DeepSpeedCPUAdam", 28, deepspeed_adam), (f"opforge CPUAdam ({best})", 28, opforge_adam)]
    bf16_impls = [("torch AdamW fused (bf16 states)", 14, torch_adamw(True)),
                  ("DeepSpeedCPUAdam (fp32 states)", 22, deepspeed_adam),
                  ("opforge CPUAdam (fp32 states)", 22, opforge_adam)]
    for label in args.sizes:
        n = parse_size(label)
        out = res["sizes"][label] = {"n": n, "fp32": {}, "bf16": {}, "variants": {}}
        say(f"{label}: triad")
        out["triad"] = triad(ops, 16 * n, args.warmup, args.steps)
        g = torch.Generator().manual_seed(0)
        src = (torch.randn(n, generator=g), torch.randn(n, generator=g) * 1e-2)
        jobs = {"fp32": [(name, bpe, make, torch.float32) for name, bpe, make in fp32_impls],
                "variants": [(name, 28, opforge_variant(name), torch.float32) for name in variants],
                "bf16": [(name, bpe, make, torch.bfloat16) for name, bpe, make in bf16_impls]}
        for table, impls in jobs.items():
            impls = [j for j in impls if not (j[2] is deepspeed_adam and "error" in res["deepspeed"])]
            say(f"{label}: {table}: {', '.join(j[0] for j in impls)}")
            got = cells({name: make for name, _, make, _ in impls}, src, impls[0][3], args.warmup, args.steps,
                        args.cold)
            for name, bpe, _, _ in impls:
                r = got[name]
                if "error" in r:
                    res["deepspeed"]["error"] = r["error"]
                    say(f"DeepSpeed failed, going on without it: {r['error'][:300]}")
                    continue
                r.update(bytes_per_elem=bpe, gbs=bpe * n / r["median_s"] / 1e9)
                r["pct_triad"] = 100 * r["gbs"] / out["triad"]["gbs12"]
                out[table][name] = r
        del src
        gc.collect()
        for table in ("fp32", "bf16", "variants"):  # ratios: the other's time / this one's
            base = out["fp32" if table == "variants" else table]
            fused = next((r for k, r in base.items() if k.startswith("torch AdamW fused")), None)
            ds = next((r for k, r in base.items() if k.startswith("DeepSpeed")), None)
            for r in out[table].values():
                r["x_fused"] = fused["median_s"] / r["median_s"] if fused else None
                r["x_deepspeed"] = ds["median_s"] / r["median_s"] if ds else None
    return res


def sweep(args) -> dict:
    """The profile: GB/s of the triad, Adam's traffic floor, torch fused, DeepSpeed and opforge by thread count."""
    from opforge.kernel_loader import CPUAdamLoader

    ops, isa = build_triad()
    best = CPUAdamLoader().load().name
    n, top = parse_size(args.sweep), torch.get_num_threads()
    threads = args.threads or sorted({t for t in (1, 2, 4, 8, 12, 16, 24, 32, 48, 64) if t < top} | {top})
    res: dict = {"machine": machine_info(), "size": args.sweep, "n": n, "triad_isa": isa, "best": best, "cold": args.cold,
                 "warmup": args.warmup, "steps": args.steps, "rows": []}
    try:
        with contextlib.redirect_stdout(sys.stderr):
            import deepspeed
        res["deepspeed"] = deepspeed.__version__
    except Exception as exc:  # noqa: BLE001 - reported, then the sweep goes on without it
        res["deepspeed_error"] = f"{type(exc).__name__}: {exc}"
    g = torch.Generator().manual_seed(0)
    src = (torch.randn(n, generator=g), torch.randn(n, generator=g) * 1e-2)
    impls = [("torch fused", torch_adamw(True)), ("DeepSpeed", deepspeed_adam), (f"opforge {best}", opforge_variant(best))]
    try:
        for t in threads:
            torch.set_num_threads(t)
            say(f"sweep {args.sweep}: {t} threads")
            row = {"threads": t, "triad_gbs12": triad(ops, 16 * n, args.warmup, args.steps)["gbs12"],
                   "floor": adam_floor(ops, n, args.warmup, args.steps)}
            live = {name: make for name, make in impls if make is not deepspeed_adam or "deepspeed" in res}
            for name, r in cells(live, src, torch.float32, args.warmup, args.steps, args.cold).items():
                if "error" in r:
                    res["deepspeed_error"] = r["error"]
                    res.pop("deepspeed", None)
                    say(f"DeepSpeed failed, going on without it: {r['error'][:300]}")
                    continue
                row[name] = {**r, "gbs": 28 * n / r["median_s"] / 1e9}
            res["rows"].append(row)
    finally:
        torch.set_num_threads(top)
    res["machine"]["anon_huge_mb"] = anon_huge_mb()
    return res


def report_sweep(res: dict) -> None:
    m = res["machine"]
    print(f"{m['cpu']} · {m['cpus']} CPUs · torch {m['torch']} · DeepSpeed {res.get('deepspeed', 'n/a')} · "
          f"{m['date']} · THP {m['thp']}, THP_MEM_ALLOC_ENABLE={m['thp_mem_alloc']}, "
          f"{m['anon_huge_mb']:.0f} MB of anonymous memory on huge pages at the end")
    print(f"Profile at {res['size']} fp32 params: GB/s (28 B/element for Adam and the floor, 12 B for the triad); "
          f"median of {res['steps']} after {res['warmup']} warm-up")
    names = [k for k in res["rows"][0] if k not in ("threads", "triad_gbs12", "floor")] if res["rows"] else []
    head = ["threads", "", "triad @12 B", "Adam floor", *names, *(f"{k} / floor" for k in names)]
    show("Adam step bandwidth by thread count", head,
         [[str(r["threads"]), "", f"{r['triad_gbs12']:.1f}", f"{r['floor']['gbs']:.1f}",
           *(f"{r[k]['gbs']:.1f}" for k in names), *(f"{100 * r[k]['gbs'] / r['floor']['gbs']:.0f}%" for k in names)]
          for r in res["rows"]])


def anon_huge_mb() -> float:
    """MB of this process's anonymous memory on transparent huge pages (Linux), 0 if unknown."""
    try:
        with open("/proc/self/smaps_rollup") as f:
            return next((int(ln.split()[1]) / 1024 for ln in f if ln.startswith("AnonHugePages:")), 0.0)
    except OSError:
        return 0.0


def machine_info() -> dict:
    with open("/proc/cpuinfo") as f:  # Linux only
        cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "unknown")
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            thp = f.read().strip()
    except OSError:
        thp = "unknown"
    return {"cpu": cpu, "cpus": os.cpu_count(), "threads": torch.get_num_threads(), "torch": torch.__version__,
            "python": sys.version.split()[0], "date": datetime.datetime.now().isoformat(timespec="seconds"),
            "thp": thp, "thp_mem_alloc": os.environ.get("THP_MEM_ALLOC_ENABLE", "unset")}


def ms(r: dict) -> str:
    return f"{r['median_s'] * 1e3:.2f} ({r['min_s'] * 1e3:.2f}-{r['max_s'] * 1e3:.2f})"


def x(v) -> str:
    return "-" if v is None else f"{v:.2f}x"


def show(title: str, headers: list[str], rows: list[list[str]]) -> None:
    show_table(title, headers, rows, left=2)  # size and implementation, then figures


def report(res: dict) -> None:
    m, dram, nt, ds = res["machine"], res["triad_dram"], res["triad_dram_nt"], res["deepspeed"]
    print(f"{m['cpu']} · {m['threads']} threads (torch.get_num_threads(); {m['cpus']} CPUs) · LLC "
          f"{m['llc_bytes'] / 2**20:.0f} MiB · torch {m['torch']} · DeepSpeed {ds.get('version', 'n/a')} · "
          f"Python {m['python']} · {m['date']}")
    print(f"ms/step: median (min-max) of {res['steps']} {'cold' if res['cold'] else 'hot'} steps, interleaved, after "
          f"{res['warmup']} warm-up; triad ISA "
          f"{res['triad_isa']}; '% triad' = GB/s / the same size's triad GB/s at 12 B/elem (STREAM convention)")
    print(f"DRAM triad ({dram['mbytes']:.0f} MB, >= 4x LLC): {dram['gbs12']:.1f} GB/s @12 B/elem, "
          f"{dram['gbs16']:.1f} @16 B/elem (write-allocate); non-temporal stores: {nt['gbs12']:.1f} GB/s @12 B/elem")
    if "error" in ds:
        print(f"DeepSpeed left out: {ds['error']}")
    sizes = res["sizes"]
    show("STREAM triad at each size (arrays together = Adam's fp32 working set, 16 B x N)",
         ["size", "arrays", "ms/iter", "GB/s @12 B", "GB/s @16 B"],
         [[k, f"{s['triad']['mbytes']:.0f} MB", ms(s["triad"]), f"{s['triad']['gbs12']:.1f}",
           f"{s['triad']['gbs16']:.1f}"] for k, s in sizes.items()])
    head = ["size", "implementation", "B/elem", "ms/step", "GB/s", "% triad", "vs torch fused", "vs DeepSpeed"]
    for table, title in (("fp32", "Adam step, fp32 params and states"),
                         ("bf16", "Adam step, bf16 params and grads (states fp32, except torch fused: bf16)"),
                         ("variants", "opforge variants, fp32, kernel-level adam_step_ calls")):
        show(title, head, [[k, name, str(r["bytes_per_elem"]), ms(r), f"{r['gbs']:.1f}", f"{r['pct_triad']:.0f}%",
                            x(r["x_fused"]), x(r["x_deepspeed"])]
                           for k, s in sizes.items() for name, r in s[table].items()])
    print(f"\nTargets for opforge, fp32: >= {TARGETS['x_fused']}x torch fused, >= {TARGETS['x_deepspeed']}x "
          f"DeepSpeed, >= {TARGETS['pct_triad']:.0f}% of triad")
    for k, s in sizes.items():
        r = next(r for name, r in s["fp32"].items() if name.startswith("opforge"))
        print(f"  {k}: " + ", ".join(f"{key} {'met' if r[key] >= goal else 'MISSED'}"
                                     for key, goal in TARGETS.items() if r[key] is not None))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", nargs="+", help="param elements per size, e.g. 1M 10M 100M (the default)")
    ap.add_argument("--quick", action="store_true", help="sizes 1M and 10M only")
    ap.add_argument("--warmup", type=int, default=3, help="warm-up steps per cell (default 3)")
    ap.add_argument("--steps", type=int, default=20, help="timed steps per implementation (default 20)")
    ap.add_argument("--json", metavar="PATH", help="write all results, raw step times included, as JSON")
    ap.add_argument("--cold", action="store_true",
                    help="time each step right after the other implementations' (states not in cache)")
    ap.add_argument("--sweep", metavar="SIZE", help="instead: the profile at one size (e.g. 100M) by thread count")
    ap.add_argument("--threads", nargs="+", type=int, help="thread counts for --sweep (default 1, 2, 4, ... all)")
    args = ap.parse_args()
    if args.sweep:
        res = sweep(args)
        report_sweep(res)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(res, f, indent=2)
        return
    args.sizes = args.sizes or (["1M", "10M"] if args.quick else ["1M", "10M", "100M"])
    t0 = time.perf_counter()
    res = run(args)
    res["wall_s"] = time.perf_counter() - t0
    report(res)
    print(f"\nwall time: {res['wall_s']:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)


if __name__ == "__main__":
    main()
