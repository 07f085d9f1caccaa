"""``opforge report [--json] [KIND...]``: what works on this machine, and why.

For each kernel kind, every implementation in the order the loader tries them, then its companions
(extensions its variants load by themselves; never chosen, but prebuilt and built with it): whether
the hardware it needs is here (*available*), whether it can be built and run with this
software (*compatible*), its state (prebuilt / cached / needs build / ready), and which
one the loader would choose. Then the facts those decisions were made from (the
:class:`~opforge.platform.Platform`) and the prebuilt record of the package.

Output is a set of rich tables when stdout is a terminal, plain aligned text otherwise
(no ANSI escapes), or JSON with ``--json``.

JSON: schema ``opforge.report/1``, the JSON Schema file ``report.schema.json`` beside this
module (``SCHEMA_FILE``), which describes every key; the tests validate the output against it.
"""

from __future__ import annotations

import json
import os
import sys

from .. import __version__, adopt
from .. import prebuilt as prebuilt_mod
from .. import settings as settings_mod
from ..platform import Platform
from ..status import NEEDS_BUILD
from . import user_modules
from .output import aligned

SCHEMA = "opforge.report/1"
SCHEMA_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "report.schema.json")

#: CPU features that decide between kernel variants, in the order they are shown.
SIMD_FEATURES = (
    "sse4_2", "avx", "avx2", "fma", "f16c", "avx_vnni",
    "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd", "avx512_vnni", "avx512_bf16", "avx512_fp16",
    "amx_tile", "amx_bf16", "amx_int8",
    "asimd", "asimdhp", "fphp", "asimddp", "asimdfhm", "bf16", "i8mm", "sve", "sve2", "sme",
)

_PREBUILT_KEYS = ("torch", "torch_git", "cuda", "hip", "cxx11_abi", "compiler", "machine", "python_tag", "opforge",
                  "built_at")


def add_parser(sub) -> None:
    p = sub.add_parser("report", help="which kernel implementations work on this machine, and why")
    p.add_argument("kinds", nargs="*", metavar="KIND", help="only these kernel kinds (default: all)")
    p.add_argument("--json", action="store_true", help=f"print JSON (schema {SCHEMA}) instead of tables")
    user_modules.add_option(p)
    p.set_defaults(func=cmd_report)


# -- collecting (no printing) ---------------------------------------------------------


def unknown_kinds(requested, known) -> str | None:
    """An error message naming the valid kinds when ``requested`` holds unknown ones, else None."""
    bad = [k for k in requested if k not in known]
    if not bad:
        return None
    return (f"unknown kernel kind{'s' if len(bad) > 1 else ''}: {', '.join(bad)}; "
            f"the kinds are: {', '.join(sorted(known)) or '(none registered)'}")


def candidate_json(c) -> dict:
    ext = c.extension
    return {
        "name": ext.name,
        "backend": ext.backend,
        "priority": ext.priority,
        "available": bool(c.available),
        "available_reason": c.available.reason,
        "compatible": bool(c.compatible),
        "compatible_reason": c.compatible.reason,
        "accepted": bool(c.decision),
        "reason": c.decision.reason,
        "state": c.status.state if c.status is not None else None,
        "note": c.status.note if c.status is not None else "",
        "chosen": c.chosen,
        "adopted_from": adopt.describe(ext),
        **on_remote(c),
    }


def on_remote(c) -> dict:
    """For a candidate that would be built: does the remote cache (OPFORGE_REMOTE_CACHE) hold it
    (``remote``), and what would a pull do with it under the trust settings (``remote_pull``: "would be
    pulled (...)", "refused: unsigned (...)", "refused: untrusted key (...)", "refused: ...";
    ``remote.predict``, which reads each object's signature, not its binary)? Both None when no store is
    set, the candidate needs no build, or the store can't be asked (within OPFORGE_REMOTE_TIMEOUT)."""
    none = {"remote": None, "remote_pull": None}
    status = c.status
    if status is None or status.state != NEEDS_BUILD or status.spec is None or status.settings is None:
        return none
    if not status.settings.remote_cache:
        return none
    from ..engine import remote
    from ..engine.progress import Reporter

    verdict = remote.predict(status.spec, status.settings, Reporter(False))
    return none if verdict is None else {"remote": bool(verdict), "remote_pull": verdict or None}


def prebuilt_json(pb: prebuilt_mod.Prebuilt, platform: Platform) -> dict:
    out: dict = {"directory": pb.directory, "present": bool(pb.info)}
    for key in _PREBUILT_KEYS:
        out[key] = pb.info.get(key)
    exts = []
    for name in pb.names:
        e = pb.entry(name) or {}
        verdict = pb.check(name, platform)
        exts.append({"name": name, "file": e.get("file"), "kind": e.get("kind"), "backend": e.get("backend"),
                     "isa": e.get("isa"), "stable_abi": e.get("stable_abi"), "usable": bool(verdict),
                     "reason": verdict.reason})
    out["extensions"] = exts
    return out


def collect(kinds=(), platform: Platform | None = None, prebuilt: prebuilt_mod.Prebuilt | None = None) -> dict:
    """The report as a JSON-able dict (see the module docstring). ``kinds`` must be valid."""
    from .. import registry  # the kernel families, which are torch code: imported by a report, not by its --help
    from ..platform import current

    platform = platform or current(settings_mod.current())
    prebuilt = prebuilt if prebuilt is not None else prebuilt_mod.read()
    all_loaders = registry.loaders()
    out_kinds = []
    packages: set[str] = set()
    for kind, cls in all_loaders.items():
        if kinds and kind not in kinds:
            continue
        packages.update(e.aot_package for e in (*cls().extensions(), *cls.companions()))
        cands = cls().candidates(platform, prebuilt)
        chosen = next((c.name for c in cands if c.chosen), None)
        by_device = {}
        if any(c.extension.devices for c in cands):  # a family with device-specific variants
            for device in ("cpu", "cuda") if platform.gpus else ("cpu",):
                per = cls().candidates(platform, prebuilt, device=device)
                by_device[device] = next((c.name for c in per if c.chosen), None)
        out_kinds.append({"kind": kind, "loader": f"{cls.__module__}.{cls.__qualname__}", "chosen": chosen,
                          "by_device": by_device, "candidates": [candidate_json(c) for c in cands],
                          "companions": [candidate_json(c) for c in cls().companion_candidates(platform, prebuilt)]})
    return {
        "schema": SCHEMA,
        "opforge": __version__,
        "platform": platform.to_json(),
        "prebuilt": prebuilt_json(prebuilt, platform),
        "packages": [{"package": pkg, **prebuilt_json(prebuilt_mod.for_package(pkg), platform)}
                     for pkg in sorted(packages - {prebuilt_mod.PACKAGE})],
        "kinds": out_kinds,
    }


# -- turning the dict into lines (shared by the plain and rich output) ----------------


def _choice(k: dict) -> str:
    """``bias_act_cuda (for cpu tensors: bias_act_avx512)``: the loader's pick, and the pick per
    tensor device where that differs."""
    best = k["chosen"] or "nothing"
    other = [f"for {d} tensors: {n or 'nothing'}" for d, n in k.get("by_device", {}).items() if n != k["chosen"]]
    return f"{best} ({'; '.join(other)})" if other else best


def _yes_no(ok: bool) -> str:
    return "yes" if ok else "no"


def candidate_detail(c: dict) -> str:
    """Why it was rejected (each failing check), else the accepted reason and any note."""
    if not c["accepted"]:
        why = [c[k + "_reason"] for k in ("available", "compatible") if not c[k] and c[k + "_reason"]]
        detail = "; ".join(why) or c["reason"]
    else:
        detail = "; ".join(x for x in (c["note"], c["reason"]) if x)
    if c.get("remote"):
        detail = "; ".join(x for x in (detail, remote_detail(c.get("remote_pull") or "")) if x)
    if c.get("adopted_from"):
        detail = "; ".join(x for x in (f"adopted from {c['adopted_from']}", detail) if x)
    return detail


def remote_detail(pull: str) -> str:
    """The report's words for a candidate the remote cache holds (``on_remote``'s ``remote_pull``).

    >>> remote_detail("would be pulled (signed by ci)")
    'on the remote cache: it would be pulled (signed by ci), not built'
    >>> remote_detail("refused: unsigned (sign pushes)")
    'on the remote cache, but a pull would be refused: unsigned (sign pushes); so it would be built'
    """
    if pull.startswith("would be pulled"):
        return f"on the remote cache: it {pull}, not built"
    return f"on the remote cache, but a pull would be {pull}; so it would be built"


def _tool(t: dict | None, missing: str = "not found") -> str:
    if not t:
        return missing
    return f"{t['path']}: {t['version']}" if t.get("version") else f"{t['path']} (version unknown)"


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def gpu_line(g: dict) -> str:
    cap = g.get("capability")
    arch = g.get("arch") or ""
    what = ", ".join(x for x in (arch, f"capability {cap[0]}.{cap[1]}" if cap else "",
                                 _gib(g["memory_bytes"]) if g.get("memory_bytes") else "") if x)
    return f"{g['index']}: {g['name']}" + (f" ({what})" if what else "")


def platform_rows(p: dict) -> list[tuple[str, str]]:
    cpu = p["cpu"]
    feats = [f for f in SIMD_FEATURES if f in set(cpu["features"])]
    gpus = [gpu_line(g) for g in p["gpus"]] or ["none"]
    rows = [
        ("os / machine", f"{p['os']} {p['machine']}"),
        ("cpu", (f"{cpu['microarch']} ({cpu['vendor'] or 'unknown vendor'}, {cpu['family']}), "
                 f"{cpu['cores']} core{'s' if cpu['cores'] != 1 else ''} usable")),
        ("simd features", " ".join(feats) or "none of note"),
    ]
    rows += [("gpus" if i == 0 else "", g) for i, g in enumerate(gpus)]
    rows += [
        ("gpu probe", p["gpu_probe"]),
        ("c++ compiler", _tool(p["cxx"])),
        ("nvcc", _tool(p["nvcc"])),
        ("ninja", _tool(p["ninja"], "not found (`pip install ninja`)")),
        ("torch", p["torch_version"] + (f" (git {p['torch_git'][:12]})" if p["torch_git"] else "")),
        ("cuda / hip", f"{p['torch_cuda'] or '-'} / {p['torch_hip'] or '-'}"),
        ("c++11 abi", _yes_no(p["cxx11_abi"])),
        ("python", p["python_tag"]),
        ("triton", p["triton"] or "not installed"),
    ]
    return rows


def prebuilt_rows(pb: dict) -> list[tuple[str, str]]:
    rows = [("directory", pb["directory"])]
    if not pb["present"]:
        rows.append(("kernels", "none (installed without OPFORGE_BUILD: kernels are built just in time)"))
        return rows
    built = pb["torch"] or "?"
    if pb.get("cuda"):
        built += f", CUDA {pb['cuda']}"
    if pb.get("hip"):
        built += f", HIP {pb['hip']}"
    rows.append(("built for", f"torch {built}"))
    if pb.get("compiler"):
        rows.append(("compiler", pb["compiler"]))
    for i, e in enumerate(pb["extensions"]):
        verdict = "usable" if e["usable"] else "not usable"
        rows.append(("extensions" if i == 0 else "", f"{e['name']} ({e['file']}): {verdict}: {e['reason']}"))
    if not pb["extensions"]:
        rows.append(("extensions", "none"))
    return rows


def prebuilt_sections(data: dict) -> list[tuple[str, dict]]:
    """("prebuilt kernels", opforge's record), then one per other package that has a record: a package
    installed without prebuilt kernels, or none at all (an adopted class's module, ``__main__``), has no
    section, only its ``present: false`` in the JSON."""
    return [("prebuilt kernels", data["prebuilt"])] + \
        [(f"prebuilt kernels of {pb['package']}", pb) for pb in data.get("packages", []) if pb["present"]]


CANDIDATE_COLUMNS = ("", "name", "backend", "priority", "available", "compatible", "state", "detail")


def candidate_cells(c: dict, companion: bool = False) -> list[str]:
    """A variant's row; a companion's (``companion``) is marked ``+`` and has no priority: none is chosen."""
    return ["+" if companion else "*" if c["chosen"] else "", c["name"], c["backend"],
            "-" if companion else str(c["priority"]), _yes_no(c["available"]), _yes_no(c["compatible"]),
            c["state"] or "-", candidate_detail(c)]


def kind_rows(k: dict) -> list[tuple[dict, list[str]]]:
    """Each variant's (candidate, cells), then each companion's."""
    return [(c, candidate_cells(c)) for c in k["candidates"]] + \
        [(c, candidate_cells(c, companion=True)) for c in k.get("companions", [])]


# -- printing ---------------------------------------------------------------------------


def print_plain(data: dict, out=None) -> None:
    out = out or sys.stdout

    def w(line=""):
        print(line, file=out)

    w(f"opforge {data['opforge']} report")
    for k in data["kinds"]:
        w()
        w(f"{k['kind']} ({k['loader']}): chooses {_choice(k)}")
        rows = [list(CANDIDATE_COLUMNS)] + [cells for _, cells in kind_rows(k)]
        for line in aligned(rows):
            w(line)
    if data["kinds"]:
        w("  (* = the implementation the loader would choose)")
    if any(k.get("companions") for k in data["kinds"]):
        w("  (+ = a companion: loaded by the kind's variants themselves, prebuilt and built with the kind)")
    w()
    w("platform")
    for line in aligned([list(r) for r in platform_rows(data["platform"])]):
        w(line)
    for title, pb in prebuilt_sections(data):
        w()
        w(title)
        for line in aligned([list(r) for r in prebuilt_rows(pb)]):
            w(line)


def print_rich(data: dict, console=None) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = console or Console()
    for k in data["kinds"]:
        table = Table(title=f"{k['kind']}: chooses {_choice(k)}", caption=k["loader"],
                      title_justify="left")
        for col in CANDIDATE_COLUMNS:
            table.add_column(col, justify="right" if col == "priority" else "left",
                             overflow="fold" if col == "detail" else "ellipsis", no_wrap=col != "detail")
        if k.get("companions"):
            table.caption += " (+ = a companion: loaded by the variants themselves, prebuilt and built with the kind)"
        for c, plain in kind_rows(k):
            cells = [escape(x) for x in plain]
            cells[0] = "✔" if c["chosen"] else plain[0]
            cells[4] = "[green]yes[/]" if c["available"] else "[red]no[/]"
            cells[5] = "[green]yes[/]" if c["compatible"] else "[red]no[/]"
            style = "bold green" if c["chosen"] else ("dim" if not c["accepted"] else None)
            table.add_row(*cells, style=style)
        console.print(table)
    for title, rows in [("platform", platform_rows(data["platform"]))] + \
            [(t, prebuilt_rows(pb)) for t, pb in prebuilt_sections(data)]:
        table = Table(title=title, show_header=False, title_justify="left")
        table.add_column("fact", style="bold")
        table.add_column("value", overflow="fold")
        for key, value in rows:
            table.add_row(escape(key), escape(value))
        console.print(table)


def cmd_report(args) -> int:
    from .. import registry

    error = user_modules.import_all(args.imports)
    if error:
        print(f"opforge report: {error}", file=sys.stderr)
        return 2
    known = registry.loaders()
    error = unknown_kinds(args.kinds, known)
    if error:
        print(f"opforge report: {error}", file=sys.stderr)
        return 2
    data = collect(tuple(args.kinds))
    if args.json:
        json.dump(data, sys.stdout, indent=1)
        print()
    elif sys.stdout.isatty():
        print_rich(data)
    else:
        print_plain(data)
    return 0
