"""CPU instruction sets that opforge builds kernel variants for, with the explicit flags
each is compiled with and the CPU features (archspec's names) it needs at run time.

Variants are compiled with these flags, never tuned to the build host (no native -march): a wheel holds
every x86 variant and runs on any x86 host, and the loader picks by the CPU it finds.

For a class adopted with ``-march=native`` (``adopt.py``), :func:`declared_machine` reads which
architecture it is written for from its own flags, checks and names, and :func:`variants_for` keeps
that architecture's variants: an Arm class gets no ``_avx512``, an x86 class no ``_neon``.

>>> AVX512.flags[:3]
('-mavx512f', '-mavx512bw', '-mavx512vl')
>>> from opforge.platform import Cpu, Platform
>>> AVX512.supports(Platform(cpu=Cpu(features=frozenset({"avx2", "fma", "f16c"}))))
Rejected(reason='needs AVX-512 (F/BW/VL); this CPU (x86_64) lacks avx512f, avx512bw, avx512vl', ok=False)
>>> NEON.supports(Platform(machine="x86_64"))
Rejected(reason='needs an aarch64 CPU (NEON); this machine is x86_64', ok=False)
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass

from .decision import Accepted, Decision, Rejected


@dataclass(frozen=True)
class Isa:
    name: str
    label: str
    machines: tuple[str, ...]
    """``uname -m`` values it can run on; empty means any."""
    flags: tuple[str, ...]
    features: tuple[str, ...]
    """archspec feature names the CPU must report."""
    simd_width: int
    """fp32 lanes per vector."""

    def supports(self, platform) -> Decision:
        """Can this machine's CPU run code built with :attr:`flags`?"""
        if self.machines and platform.machine not in self.machines:
            return Rejected(f"needs {'an ' + self.machines[0] if self.machines[0][0] in 'aeiou' else 'a ' + self.machines[0]}"
                            f" CPU ({self.label}); this machine is {platform.machine}")
        missing = platform.cpu.missing(*self.features)
        if missing:
            return Rejected(f"needs {self.label}; this CPU ({platform.cpu.microarch}) lacks {', '.join(missing)}")
        return Accepted(f"{self.label} on {platform.cpu.microarch}" if self.features else "")

    def buildable_on(self, machine: str) -> bool:
        """Can a compiler for ``machine`` produce it? (x86 variants all build on any x86 host.)"""
        return not self.machines or machine in self.machines


_X86 = ("x86_64", "AMD64")
_ARM = ("aarch64", "arm64")

AVX512 = Isa("avx512", "AVX-512 (F/BW/VL)", _X86,
             ("-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx2", "-mfma", "-mf16c"),
             ("avx512f", "avx512bw", "avx512vl", "avx2", "fma", "f16c"), 16)
AVX2 = Isa("avx2", "AVX2+FMA+F16C", _X86, ("-mavx2", "-mfma", "-mf16c"), ("avx2", "fma", "f16c"), 8)
# NEON (ASIMD) is part of the aarch64 baseline: no flag is needed, and every aarch64 CPU reports asimd.
NEON = Isa("neon", "NEON", _ARM, (), ("asimd",), 4)
PORTABLE = Isa("portable", "portable C++", (), (), (), 1)

ALL = {i.name: i for i in (AVX512, AVX2, NEON, PORTABLE)}

#: The CPU variants of a C++ kernel: name suffix, ISA, loader priority (higher first).
#: NEON and AVX2 never compete (different machines), so they share a priority.
CPU_VARIANTS = (("avx512", AVX512, 40), ("avx2", AVX2, 30), ("neon", NEON, 30), ("scalar", PORTABLE, 10))


# -- which architecture a declaration is written for (adopted classes: ``adopt.py``) ---------------

X86_64, AARCH64 = "x86_64", "aarch64"
_WORDS = {X86_64: re.compile(r"x86|x64|amd64|i[3-6]86|avx\w*|sse\d\w*|ssse3"),
          AARCH64: re.compile(r"arm|arm64|aarch64|armv\d\w*|neon|sve\d*|asimd")}
_FLAGS = {X86_64: re.compile(r"-m(avx|sse|ssse|fma|f16c|amx|bmi|popcnt)\w*|-march=(x86-64\S*|core-avx\S*|nehalem|"
                             r"sandybridge|ivybridge|haswell|broadwell|skylake\S*|cascadelake|cooperlake|icelake\S*|"
                             r"tigerlake|alderlake|sapphirerapids|znver\d)"),
          AARCH64: re.compile(r"-march=armv\S*|-mcpu=(neoverse|cortex|apple|a64fx|thunderx)\S*|-mfpu=neon\S*|"
                              r"-msve-vector-bits=\S+")}
_LITERAL = re.compile(r"""(['"])(.*?)(?<!\\)\1""")


def _words(text: str) -> list[str]:
    """``CpuAdamX86Extension`` -> cpu, adam, x86, extension; ``cpu_adam_arm.cpp`` -> cpu, adam, arm, cpp."""
    return [w.lower() for part in re.split(r"[^A-Za-z0-9]+", text)
            for w in re.findall(r"[A-Z]+[0-9]*(?![a-z])|[A-Z]?[a-z0-9]+", part)]


def _said(texts: Iterable[str], evidence) -> dict[str, list[str]]:
    """What in ``texts`` names each machine (``evidence(machine, text)``: the part that does, or None), by machine."""
    found: dict[str, list[str]] = {}
    for text in texts:
        for machine in (X86_64, AARCH64):
            what = evidence(machine, text)
            if what and what not in found.get(machine, []):
                found.setdefault(machine, []).append(what)
    return found


def _flag(machine: str, flag: str) -> str | None:
    return flag if _FLAGS[machine].fullmatch(flag) else None


def _named(machine: str, text: str) -> str | None:
    return text if any(_WORDS[machine].fullmatch(w) for w in _words(text)) else None


def _quoted(machine: str, literal: str) -> str | None:
    return f'"{literal}"' if _named(machine, literal) else None


def declared_machine(flags: Iterable[str] = (), checks: Iterable[str] = (),
                     names: Iterable[str] = ()) -> tuple[str | None, str]:
    """The CPU architecture (``x86_64`` or ``aarch64``) a declaration is written for, and why; ``None``
    when it says nothing, or says both. Read from, first to last (the first that says anything decides):
    its compile ``flags`` (``-mavx2``, ``-march=armv8.2-a``); the one-word string literals in the source
    of its ``checks``, the values they compare ``platform.machine()`` with (``"aarch64"``; not their
    messages' prose); its ``names`` (class, extension, source files), word by word
    (``CpuAdamArmExtension``: arm; ``warmup``: nothing). Pure.

    >>> declared_machine(names=["CpuAdamArmExtension", "cpu_adam_arm", "arm/cpu_adam_arm.cpp"])
    ('aarch64', 'its names say aarch64 (CpuAdamArmExtension, cpu_adam_arm, arm/cpu_adam_arm.cpp)')
    >>> declared_machine(checks=['def is_available(self):\\n    return platform.machine() == "x86_64"'],
    ...                  names=["CpuAdamArmExtension"])
    ('x86_64', 'its checks say x86_64 ("x86_64")')
    >>> declared_machine(flags=["-O3", "-march=native", "-mavx2"], names=["neon_adam"])
    ('x86_64', 'its flags say x86_64 (-mavx2)')
    >>> declared_machine(names=["warmup", "FarmKernel"])
    (None, 'no architecture in its flags, checks or names: one variant per CPU ISA')
    >>> declared_machine(names=["x86_to_arm_bridge"])
    (None, 'its names say both x86_64 (x86_to_arm_bridge) and aarch64 (x86_to_arm_bridge): one variant per CPU ISA')
    """
    literals = [m.group(2) for text in checks for m in _LITERAL.finditer(text) if not re.search(r"\s", m.group(2))]
    tiers = (("flags", [str(f).strip() for f in flags], _flag), ("checks", literals, _quoted),
             ("names", [str(n) for n in names], _named))
    for what, texts, evidence in tiers:
        said = {machine: ", ".join(found) for machine, found in _said(texts, evidence).items()}
        if len(said) == 1:
            ((machine, listed),) = said.items()
            return machine, f"its {what} say {machine} ({listed})"
        if said:
            return None, f"its {what} say both {X86_64} ({said[X86_64]}) and {AARCH64} ({said[AARCH64]}): one variant per CPU ISA"
    return None, "no architecture in its flags, checks or names: one variant per CPU ISA"


def variants_for(machine: str | None) -> tuple:
    """The ``CPU_VARIANTS`` that a compiler for ``machine`` can build (every one for ``None``).

    >>> [suffix for suffix, _, _ in variants_for("aarch64")], [suffix for suffix, _, _ in variants_for(None)]
    (['neon', 'scalar'], ['avx512', 'avx2', 'neon', 'scalar'])
    """
    return tuple(v for v in CPU_VARIANTS if machine is None or v[1].buildable_on(machine))


def source_names(paths: Iterable[str]) -> list[str]:
    """A source's file and the directory that holds it (``kernel/arm/cpu_adam.cpp``): the part of a path
    that names what it is, not where it was unpacked.

    >>> source_names(["/home/u/colossalai/extensions/csrc/kernel/x86/cpu_adam.cpp"])
    ['x86/cpu_adam.cpp']
    """
    return [os.path.join(os.path.basename(os.path.dirname(p)), os.path.basename(p)) for p in paths]
