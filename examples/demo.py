"""opforge vs torch.utils.cpp_extension.load on a real extension: cold build and warm load.

Run with ``make demo`` (or ``.venv/bin/python examples/demo.py``); about 3 minutes on
two cores, almost all of it compiles of ``torch/extension.h``.

What is measured, for ``examples/demo_ext/demo_ext.cpp`` (a fused relu(x + alpha*y),
built with ``extra_cflags=['-O2']`` by both):

* torch ``load`` cold   : empty ``TORCH_EXTENSIONS_DIR``, so it compiles and links;
* torch ``load`` warm   : a new process (the median of 5), same ``TORCH_EXTENSIONS_DIR``;
* ``opforge.load`` first: empty ``OPFORGE_CACHE_DIR``: the plain build, the same commands as with the
  shared PCH off;
* ``opforge.load`` second: the entry removed and built again: the second build of these flags, which,
  once done, starts the shared precompiled ``torch/extension.h`` in the background (waited for, and its
  time and size shown);
* ``opforge.load`` cold : the entry removed again, the shared PCH there (any later build with the same
  compiler and flags);
* ``opforge.load`` warm : a new process (the median of 5), same ``OPFORGE_CACHE_DIR``.

ccache is off for both (``OPFORGE_CCACHE=0``, and ``TORCH_NO_COMPILER_WRAPPER=1`` since
recent torch prepends ccache/sccache by itself when one is on PATH).

How: each measurement is a fresh child process (``sys.executable demo.py --child ...``).
The child imports torch and the loader's module (``torch.utils.cpp_extension`` or
``opforge``, each timed on its own) *before* starting the clock, then times the
``load()`` call alone with ``time.perf_counter``, checks the op against a pure-torch
reference, and prints its timings as one JSON line on stdout. The parent first reads
torch's headers once (so the first cold build does not pay for the disk), then prints a
table. The cache directories live under one ``tempfile.mkdtemp`` removed at the end.

Then the kernel loaders, CPUAdam, bias_act and BlockSparseLinear on this machine, and to
close, ``opforge bench --quick``: every kernel family against its peers in one table each.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.join(HERE, "demo_ext", "demo_ext.cpp")
NAME = "demo_ext"
CFLAGS = ["-O2"]
MARK = "DEMO-RESULT "


def child(tool: str) -> None:
    """One measurement: import (untimed by the load clock), load() under the clock, check."""
    t0 = time.perf_counter()
    import torch

    t1 = time.perf_counter()
    if tool == "torch":
        from torch.utils.cpp_extension import load
    else:
        from opforge import load
    t2 = time.perf_counter()
    ext = load(NAME, [SOURCE], extra_cflags=CFLAGS)
    t3 = time.perf_counter()

    x, y = torch.randn(1000, 257), torch.randn(1000, 257)
    got = ext.scaled_residual_relu(x, y, 0.5)
    if not torch.allclose(got, torch.relu(x + 0.5 * y), rtol=1e-6, atol=1e-6):
        sys.exit(f"{tool}: scaled_residual_relu disagrees with torch.relu(x + 0.5 * y)")
    try:  # the op's input checks work and say what is wrong
        ext.scaled_residual_relu(x, y.double(), 0.5)
        sys.exit(f"{tool}: a float64 input was accepted")
    except RuntimeError as exc:
        if "must be float32" not in str(exc):
            sys.exit(f"{tool}: unexpected error text: {exc}")
    print(MARK + json.dumps({"tool": tool, "import_torch_s": t1 - t0, "import_loader_s": t2 - t1,
                             "load_s": t3 - t2}), flush=True)


def run_child(tool: str, env: dict[str, str]) -> dict:
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", tool], env=env,
                          capture_output=True, text=True, timeout=600)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(MARK)]
    if proc.returncode != 0 or not lines:
        sys.stderr.write(proc.stdout + proc.stderr)
        raise SystemExit(f"the {tool} child failed (exit {proc.returncode}); its output is above")
    return json.loads(lines[-1][len(MARK):])


def prime_page_cache() -> None:
    """Read torch's headers once, so that whichever cold build runs first does not also pay
    for reading them from disk (that alone can be seconds)."""
    import torch

    for d, _, files in os.walk(os.path.join(os.path.dirname(torch.__file__), "include")):
        for f in files:
            with open(os.path.join(d, f), "rb") as fh:
                fh.read()


def ratio(r: float) -> str:
    return f"{r:.2f}x" if r < 10 else f"{r:.0f}x"


def fmt(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"


WARM_RUNS = 5


def main() -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    import torch  # only for its version in the title

    root = tempfile.mkdtemp(prefix="opforge-demo-")
    # No ccache for either loader (torch >= 2.10 prepends ccache/sccache when on PATH).
    base = dict(os.environ, OPFORGE_CCACHE="0", TORCH_NO_COMPILER_WRAPPER="1")
    base.pop("OPFORGE_VERBOSE", None)
    envs = {
        "torch": dict(base, TORCH_EXTENSIONS_DIR=os.path.join(root, "torch_extensions")),
        "opforge": dict(base, OPFORGE_CACHE_DIR=os.path.join(root, "opforge_cache")),
    }
    results: dict[tuple[str, str], dict] = {}
    prime_page_cache()
    from opforge.engine import pch_store

    cache = envs["opforge"]["OPFORGE_CACHE_DIR"]
    pch_made = []
    try:
        for tool, phase, runs in (("torch", "cold", 1), ("torch", "warm", WARM_RUNS), ("opforge", "first", 1),
                                  ("opforge", "second", 1), ("opforge", "cold", 1), ("opforge", "warm", WARM_RUNS)):
            if (tool, phase) in (("opforge", "second"), ("opforge", "cold")):
                shutil.rmtree(os.path.join(cache, NAME))  # the entry goes (`opforge cache clean demo_ext`)
            if (tool, phase) == ("opforge", "cold"):  # the second build of these flags started the PCH
                with console.status("opforge: the shared PCH, being made in the background at the lowest priority…"):
                    pch_store.wait(cache, timeout=1200)
                pch_made = [pch_store.read_record(pch_store.Pch(os.path.join(cache, ".pch"), s.key, (), ()))
                            for s in pch_store.stored(os.path.join(cache, ".pch"))]
                for rec in pch_made:
                    console.print(f"  opforge  the shared PCH: made in the background in {rec.get('made_s')} s, "
                                  f"{rec.get('size', 0) / 2**20:.0f} MiB (capped: OPFORGE_PCH_MAX_SIZE)")
            with console.status(f"{tool} load, {phase} ({runs} new process{'es' if runs > 1 else ''})…"):
                started = time.perf_counter()
                tries = sorted((run_child(tool, envs[tool]) for _ in range(runs)), key=lambda r: r["load_s"])
                results[tool, phase] = r = tries[len(tries) // 2]  # the median run
                wall = (time.perf_counter() - started) / runs
            median = f" (median of {runs})" if runs > 1 else ""
            console.print(f"  {tool:<8} {phase}: load() {fmt(r['load_s']):>9}{median}   (whole process {fmt(wall)})")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if not pch_made:
        raise SystemExit("opforge: the second build of demo_ext's flags did not make the shared PCH")

    imp_torch = min(r["import_torch_s"] for r in results.values())
    table = Table(title=f"{NAME}: load() in a fresh process (torch {torch.__version__}, {os.cpu_count()} cores)",
                  caption=f"load() call only; import torch ({fmt(imp_torch)}) and the loader's import are "
                          "outside the clock (its import: torch.utils.cpp_extension vs opforge, in the warm child)")
    table.add_column("")
    table.add_column("torch", justify="right")
    table.add_column("opforge", justify="right")
    table.add_column("opforge/torch", justify="right")
    tc = results["torch", "cold"]["load_s"]
    for label, t, o in (
            ("first build ever (empty caches)", tc, results["opforge", "first"]["load_s"]),
            ("cold build, the shared PCH there (these flags built twice before)", tc, results["opforge", "cold"]["load_s"]),
            ("warm load (already built)", results["torch", "warm"]["load_s"], results["opforge", "warm"]["load_s"]),
            ("import of the loader", results["torch", "warm"]["import_loader_s"],
             results["opforge", "warm"]["import_loader_s"])):
        table.add_row(label, fmt(t), fmt(o), ratio(o / t))
    console.print(table)
    tw, ow = results["torch", "warm"]["load_s"], results["opforge", "warm"]["load_s"]
    of, oc = results["opforge", "first"]["load_s"], results["opforge", "cold"]["load_s"]
    console.print(f"[bold]Cold build: opforge's first {fmt(of)} vs torch's {fmt(tc)} ({ratio(of / tc)}), with the PCH "
                  f"there {fmt(oc)} ({ratio(oc / tc)}); warm load: {fmt(ow)} vs {fmt(tw)} ({ratio(tw / ow)} faster).[/bold] "
                  "Both results match torch.")
    loaders_part(console, base)
    cpu_adam_part(console, base)
    bias_act_part(console, base)
    block_sparse_part(console)
    bench_part(console, base)


def bench_part(console, base: dict[str, str]) -> None:
    """Every family against its peers in one command: `opforge bench --quick` (docs/bench.md)."""
    console.print("\n[bold]All the kernels against their peers[/bold]: `opforge bench --quick` "
                  "(small sizes, a check; drop --quick for the figures, add --plot out.png for pictures)")
    out = subprocess.run([sys.executable, "-m", "opforge.cli", "bench", "--quick"], env=base, check=False)
    if out.returncode != 0:
        raise SystemExit(f"opforge bench failed (exit {out.returncode}); its output is above")


ADAM_CHILD = r"""
import json, statistics, time, torch
from opforge.optim import CPUAdam
torch.manual_seed(0)
def net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(1024, 2048), torch.nn.GELU(), torch.nn.Linear(2048, 2048),
                               torch.nn.GELU(), torch.nn.Linear(2048, 1024))
x, y = torch.randn(64, 1024), torch.randn(64, 1024)
out = {}
for name in ("torch fused AdamW", "opforge CPUAdam"):
    m = net()
    opt = (torch.optim.AdamW(m.parameters(), lr=1e-3, weight_decay=0.01, fused=True) if name.startswith("torch")
           else CPUAdam(m.parameters(), lr=1e-3, weight_decay=0.01))
    steps, losses = [], []
    for i in range(25):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(m(x), y)
        loss.backward()
        t = time.perf_counter(); opt.step(); steps.append(time.perf_counter() - t)
        losses.append(loss.item())
    out[name] = {"step_ms": 1000 * statistics.median(steps[5:]), "loss": losses[-1],
                 "params": sum(p.numel() for p in m.parameters()),
                 "kernel": getattr(getattr(opt, "kernel", None), "name", "torch")}
print(json.dumps(out))
"""


def cpu_adam_part(console, base: dict[str, str]) -> None:
    """A short training loop: opforge.optim.CPUAdam against torch's fused AdamW, step time and loss."""
    root = tempfile.mkdtemp(prefix="opforge-demo-adam-")
    try:
        with console.status("CPUAdam vs torch AdamW(fused=True): 25 steps of a 10M-parameter MLP…"):
            out = subprocess.run([sys.executable, "-c", ADAM_CHILD], env=dict(base, OPFORGE_CACHE_DIR=root),
                                 capture_output=True, text=True, timeout=900, check=False)
        if out.returncode != 0:
            sys.stderr.write(out.stdout + out.stderr)
            raise SystemExit("the CPUAdam child failed; its output is above")
        r = json.loads(out.stdout.strip().splitlines()[-1])
        t, o = r["torch fused AdamW"], r["opforge CPUAdam"]
        console.print(f"\n[bold]CPUAdam[/bold] ({o['params'] / 1e6:.1f}M params, kernel {o['kernel']}): optimizer step "
                      f"{o['step_ms']:.2f} ms vs torch AdamW(fused=True) {t['step_ms']:.2f} ms "
                      f"({t['step_ms'] / o['step_ms']:.2f}x); loss after 25 steps {o['loss']:.6f} vs {t['loss']:.6f}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


BIAS_ACT_CHILD = r"""
import json, math, statistics, time, torch
import torch.nn.functional as F
t = time.perf_counter()
from opforge.ops import bias_act
from opforge.kernels.bias_act import dispatch
k = dispatch.implementation("cpu")
load_s = time.perf_counter() - t
torch.manual_seed(0)
x = torch.randn(8, 512, 64, 64); b = torch.randn(512); dy = torch.randn_like(x)
gain = math.sqrt(2)
def eager(x, b):  # StyleGAN2's bias + lrelu + gain + clamp, as eager PyTorch writes it
    return (F.leaky_relu(x + b.view(1, -1, 1, 1), 0.2) * gain).clamp(-256, 256)
def fused(x, b):
    return bias_act(x, b, act="lrelu", clamp=256)
x64, b64 = x.double().requires_grad_(), b.double().requires_grad_()
want = eager(x64, b64); want.backward(dy.double())
xs, bs = x.clone().requires_grad_(), b.clone().requires_grad_()
y = fused(xs, bs); y.backward(dy)
err = max(((y.double() - want).norm() / want.norm()).item(), ((xs.grad.double() - x64.grad).norm() / x64.grad.norm()).item(),
          ((bs.grad.double() - b64.grad).norm() / b64.grad.norm()).item())
def med(f, n=7):
    f(); ts = []
    for _ in range(n):
        t = time.perf_counter(); f(); ts.append(time.perf_counter() - t)
    return 1000 * statistics.median(ts)
out = {"kernel": k.name, "load_s": load_s, "err": err, "numel": x.numel(), "threads": torch.get_num_threads()}
for name, f in (("eager", eager), ("opforge", fused)):
    out[name + "_fwd"] = med(lambda: f(x, b))
    xg, bg = x.clone().requires_grad_(), b.clone().requires_grad_()
    out[name + "_fwdbwd"] = med(lambda: f(xg, bg).backward(dy))
print(json.dumps(out))
"""


def bias_act_part(console, base: dict[str, str]) -> None:
    """StyleGAN2's bias + leaky ReLU + gain + clamp: the fused op against eager PyTorch, on this CPU."""
    root = tempfile.mkdtemp(prefix="opforge-demo-bias-act-")
    try:
        with console.status("bias_act vs eager PyTorch: 8x512x64x64 fp32, bias + lrelu + gain + clamp…"):
            out = subprocess.run([sys.executable, "-c", BIAS_ACT_CHILD], env=dict(base, OPFORGE_CACHE_DIR=root),
                                 capture_output=True, text=True, timeout=900, check=False)
        if out.returncode != 0:
            sys.stderr.write(out.stdout + out.stderr)
            raise SystemExit("the bias_act child failed; its output is above")
        r = json.loads(out.stdout.strip().splitlines()[-1])
        console.print(f"\n[bold]bias_act[/bold] (kernel {r['kernel']}, built and loaded in {fmt(r['load_s'])}; "
                      f"{r['threads']} threads): 8x512x64x64 fp32, lrelu + gain + clamp, matches fp64 "
                      f"(max relative error {r['err']:.1e})")
        for what, key in (("forward", "fwd"), ("forward + backward", "fwdbwd")):
            e, o = r[f"eager_{key}"], r[f"opforge_{key}"]
            console.print(f"  {what:<19} opforge {o:8.2f} ms   eager PyTorch {e:8.2f} ms   ({e / o:.2f}x)")
    finally:
        shutil.rmtree(root, ignore_errors=True)


def block_sparse_part(console) -> None:
    """BlockSparseLinear: swap a model's Linear layers for block-sparse ones, check, train a little."""
    import torch

    from opforge.kernel_loader import BlockSparseLoader
    from opforge.nn import BlockSparseLinear, sparsify

    torch.manual_seed(0)
    lin = torch.nn.Linear(256, 256)
    x = torch.randn(64, 256)
    exact = BlockSparseLinear.from_dense(lin, density=1.0, block_shape=(32, 32))
    err = ((exact(x) - lin(x)).norm() / lin(x).norm()).item()
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 256), torch.nn.GELU(),
                                torch.nn.Linear(256, 8))
    report = sparsify(model, {r"^[02]$": 0.25}, block_shape=(32, 32))
    data, target = torch.randn(512, 64), torch.randn(512, 8)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(60):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(data), target)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    kernel = BlockSparseLoader().load(device="cpu").name
    console.print(f"\n[bold]BlockSparseLinear[/bold] (kernel {kernel} on this CPU): from_dense at density 1.0 matches "
                  f"nn.Linear (relative error {err:.1e})")
    for line in str(report).splitlines():
        console.print(f"  {line}")
    console.print(f"  60 Adam steps on the sparsified model: loss {losses[0]:.3f} -> {losses[-1]:.3f}")


LOADER_CHILD = r"""
import json, time, warnings
import torch
from opforge.kernel_loader import SelftestLoader
t = time.perf_counter()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    k = SelftestLoader().load()
took = time.perf_counter() - t
x, y = torch.randn(1001), torch.randn(1001)
torch.testing.assert_close(k.axpy(x, y, 3.0), 3.0 * x + y)
print(json.dumps({"name": k.name, "origin": k.origin, "s": took, "width": k.simd_width(),
                  "warnings": [str(w.message) for w in caught]}))
"""


def loaders_part(console, base: dict[str, str]) -> None:
    """A kernel kind with per-ISA variants: what the loader picks here, cold and warm, and
    what it falls back to on a node without a compiler."""
    root = tempfile.mkdtemp(prefix="opforge-demo-loaders-")
    env = dict(base, OPFORGE_CACHE_DIR=root)
    try:
        console.print("\n[bold]Kernel loaders[/bold]: `opforge report selftest` on this machine")
        subprocess.run([sys.executable, "-m", "opforge.cli", "report", "selftest"], env=env, check=False)
        empty = os.path.join(root, "empty")
        for label, extra in (("cold (builds)", {}), ("warm (cached)", {}),
                             ("no compiler, that cache", {"CXX": "/nonexistent/c++"}),
                             ("no compiler, empty cache", {"CXX": "/nonexistent/c++", "OPFORGE_CACHE_DIR": empty})):
            out = subprocess.run([sys.executable, "-c", LOADER_CHILD], env=dict(env, **extra), capture_output=True,
                                 text=True, timeout=600, check=False)
            if out.returncode != 0:
                sys.stderr.write(out.stdout + out.stderr)
                raise SystemExit("the loader child failed; its output is above")
            r = json.loads(out.stdout.strip().splitlines()[-1])
            console.print(f"  SelftestLoader().load(), {label:<24} -> {r['name']} ({r['origin']}, simd width "
                          f"{r['width']}) in {fmt(r['s'])}; axpy matches torch")
            for w in r["warnings"]:
                console.print(f"    warning: {w}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        child(sys.argv[2])
    else:
        main()
