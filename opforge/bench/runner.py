"""Runs the suites: each family on each device, each case checked, then timed.

A case's implementations are each called once first (the untimed first call: a compile, a
lazy load), and opforge's outputs are compared with the baseline's before anything is
timed. An implementation that raises is reported with its error and left out of the
timing; for a peer that is the end of it (a peer may not run everywhere), for opforge it is
a failure (``FamilyResult.failures``, and ``opforge bench`` exits non-zero).
"""

from __future__ import annotations

import gc
import math
import time
from collections.abc import Callable, Iterable

import torch

from .model import OPFORGE, Case, CaseResult, Check, FamilyResult, Options, Row
from .suites import SUITES
from .timing import Plan, Timing, measure


def one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:400]


def tensors(out) -> list[torch.Tensor]:
    """The tensors in an output (a tensor, or a tuple/list of them; None entries skipped)."""
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in tensors(o)]
    return []


def snapshot(out) -> list[torch.Tensor]:
    """A copy of the output that later calls (which may reuse or overwrite it) leave alone."""
    return [t.detach().clone() for t in tensors(out)]


def rel_err(got: list[torch.Tensor], ref: list[torch.Tensor]) -> float:
    """The largest ``||got - ref|| / ||ref||`` over the outputs, in fp64; inf when the
    outputs don't match in number or shape, or ``got`` is not finite."""
    if len(got) != len(ref):
        return math.inf
    worst = 0.0
    for g, r in zip(got, ref):
        if g.shape != r.shape:
            return math.inf
        g64, r64 = g.double(), r.double()
        if not bool(torch.isfinite(g64).all()):
            return math.inf
        scale = float(r64.norm())
        diff = float((g64 - r64).norm())
        worst = max(worst, diff / scale if scale > 0 else diff)
    return worst


def run_case(case: Case, device: torch.device, plan: Plan) -> CaseResult:
    first: dict[str, float] = {}
    outputs: dict[str, list[torch.Tensor]] = {}
    errors: dict[str, str] = {}
    for impl in case.impls:
        try:
            t0 = time.perf_counter()
            out = impl.call()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            first[impl.name] = time.perf_counter() - t0
            outputs[impl.name] = snapshot(impl.output() if impl.output else out)
        except Exception as exc:  # noqa: BLE001 - reported in the row; a peer may not run here
            errors[impl.name] = one_line(exc)
    ref = outputs.get(case.baseline)
    checks = {}
    for impl in case.impls:
        if impl.role == OPFORGE and impl.name in outputs and ref is not None:
            err = rel_err(outputs[impl.name], ref)
            checks[impl.name] = Check(err <= case.tol, err, case.tol, case.baseline)
    del outputs, ref
    live = {i.name: i.call for i in case.impls if i.name not in errors and i.sample is None}
    timings = measure(live, device, plan) if live else {}
    for impl in case.impls:
        if impl.name not in errors and impl.sample is not None:
            try:
                timings[impl.name] = Timing(tuple(impl.sample() for _ in range(plan.repeats)), 1)
            except Exception as exc:  # noqa: BLE001 - reported in the row, as a failed first call is
                errors[impl.name] = one_line(exc)
    base = timings.get(case.baseline)
    rows = []
    for impl in case.impls:
        t = timings.get(impl.name)
        speedup = base.median / t.median if base and t and t.median > 0 else None
        rows.append(Row(impl.name, impl.role, t, first.get(impl.name), speedup, checks.get(impl.name),
                        errors.get(impl.name), impl.note))
    return CaseResult(case.op, case.label, dict(case.params), case.baseline, tuple(rows))


def run_family(kind: str, device: torch.device, options: Options, plan: Plan,
               on_case: Callable[[str], None] | None = None) -> FamilyResult:
    suite_cls = SUITES[kind]
    if device.type not in suite_cls.devices:
        return FamilyResult(kind, device.type, "skipped", f"{kind} has no {device.type} kernels (it runs on "
                            f"{', '.join(suite_cls.devices)})")
    t0 = time.perf_counter()
    try:
        suite = suite_cls(device, options)
    except Exception as exc:  # noqa: BLE001 - opforge's own kernel failed to load: a failure, reported
        return FamilyResult(kind, device.type, "failed", f"could not load opforge's kernel: {one_line(exc)}")
    load_s = time.perf_counter() - t0
    results = []
    cases = suite.cases()
    while True:
        try:
            case = next(cases, None)
        except Exception as exc:  # noqa: BLE001 - making a case's inputs failed (e.g. out of memory): reported
            return FamilyResult(kind, device.type, "failed", f"could not set up a case after {len(results)}: "
                                f"{one_line(exc)}", suite.variant, load_s, tuple(suite.missing()), tuple(results))
        if case is None:
            break
        if on_case:
            on_case(f"{kind} ({device.type}): {case.name}")
        results.append(run_case(case, device, plan))
        del case
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return FamilyResult(kind, device.type, "ok", "", suite.variant, load_s, tuple(suite.missing()),
                        tuple(results))


def devices(requested: Iterable[str] = ()) -> list[torch.device]:
    """The devices to run on: those asked for, else the CPU and, when torch sees one, the GPU."""
    names = list(requested) or (["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"])
    out = []
    for name in names:
        if name == "cuda" and not torch.cuda.is_available():
            raise ValueError("--device cuda: torch sees no CUDA GPU here (torch.cuda.is_available() is False); "
                             "run on the CPU (--device cpu) or on a machine with a GPU and a CUDA build of torch")
        if name not in ("cpu", "cuda"):
            raise ValueError(f"--device {name}: the devices are cpu and cuda")
        out.append(torch.device(name))
    return out
