"""CPU instruction sets that opforge builds kernel variants for, with the explicit flags
each is compiled with and the CPU features (archspec's names) it needs at run time.

Variants are compiled with these flags, never tuned to the build host (no native -march): a wheel holds
every x86 variant and runs on any x86 host, and the loader picks by the CPU it finds.

>>> AVX512.flags[:3]
('-mavx512f', '-mavx512bw', '-mavx512vl')
>>> from opforge.platform import Cpu, Platform
>>> AVX512.supports(Platform(cpu=Cpu(features=frozenset({"avx2", "fma", "f16c"}))))
Rejected(reason='needs AVX-512 (F/BW/VL); this CPU (x86_64) lacks avx512f, avx512bw, avx512vl', ok=False)
>>> NEON.supports(Platform(machine="x86_64"))
Rejected(reason='needs an aarch64 CPU (NEON); this machine is x86_64', ok=False)
"""

from __future__ import annotations

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
