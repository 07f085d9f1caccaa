"""A whole ``opforge bench`` run: the families' results, the machine they ran on, and how they
were timed; as JSON, schema ``opforge.bench/1`` (``schema.json``, described in docs/bench.md)."""

from __future__ import annotations

import datetime
import json
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from .. import __version__
from ..files import atomic_write
from ..platform import Platform
from .model import FamilyResult, Options
from .runner import devices as pick_devices
from .runner import run_family
from .suites import SUITES
from .timing import Plan

SCHEMA = "opforge.bench/1"
SCHEMA_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "schema.json")


def plan_for(device: torch.device, quick: bool, repeats: int | None = None) -> Plan:
    """How long to time on this device: a batch of about 5 ms (GPU 2 ms) over 5 rounds with
    ``quick``, 20 ms (GPU 5 ms) over 15 otherwise."""
    gpu = device.type == "cuda"
    plan = Plan(warmup=2, repeats=5, target_s=0.002 if gpu else 0.005) if quick else \
        Plan(warmup=5, repeats=15, target_s=0.005 if gpu else 0.02)
    if repeats is not None:
        plan = Plan(plan.warmup, repeats, plan.target_s, plan.flush)
    return plan


@dataclass(frozen=True)
class Report:
    families: tuple[FamilyResult, ...]
    platform: Platform
    options: Options
    plans: dict[str, Plan]
    started: float
    wall_s: float

    @property
    def failures(self) -> list[str]:
        return [f for fam in self.families for f in fam.failures]

    def to_json(self) -> dict:
        return {
            "schema": SCHEMA,
            "opforge": __version__,
            "created": datetime.datetime.fromtimestamp(self.started, datetime.timezone.utc).isoformat(
                timespec="seconds"),
            "wall_s": self.wall_s,
            "options": {"quick": self.options.quick, "compile": self.options.compile,
                        "threads": torch.get_num_threads(),
                        "plans": {d: {"warmup": p.warmup, "repeats": p.repeats, "target_s": p.target_s,
                                      "flush_l2": p.flush if d == "cuda" else False}
                                  for d, p in self.plans.items()}},
            "platform": self.platform.to_json(),
            "families": [f.to_json() for f in self.families],
        }

    def write_json(self, path: str) -> None:
        atomic_write(path, json.dumps(self.to_json(), indent=1, allow_nan=False) + "\n")


def run(kinds: Iterable[str] = (), device_names: Iterable[str] = (), options: Options | None = None,
        repeats: int | None = None, on_case: Callable[[str], None] | None = None) -> Report:
    """Every family of ``kinds`` (default: all) on every device of ``device_names`` (default:
    the CPU and, when there is one, the GPU)."""
    from ..platform import current

    options = options or Options()
    kinds = list(kinds) or list(SUITES)
    if not set(kinds) <= set(SUITES):
        raise ValueError(f"opforge bench times {', '.join(SUITES)}, not {', '.join(sorted(set(kinds) - set(SUITES)))}")
    devs = pick_devices(device_names)
    started, t0 = time.time(), time.perf_counter()
    plans = {d.type: plan_for(d, options.quick, repeats) for d in devs}
    families = []
    for kind in kinds:
        for dev in devs:
            families.append(run_family(kind, dev, options, plans[dev.type], on_case))
    return Report(tuple(families), current(init_cuda=bool(torch.cuda.is_available())), options, plans, started,
                  time.perf_counter() - t0)
