"""Are two builds of the same bytes at two paths bit-identical (issue 34)? And if not, what differs?

Builds each case with ``opforge.load`` twice: the same project at two paths (``/tmp/.../ci/builds/p``
and ``/tmp/.../home/u/venvs/x/p``), each node with its own cache. Then compares the two binaries: the
same sha256, or the ELF sections whose bytes differ (and whether either still names a directory of its
machine). A C++ case always; a CUDA case (``.cu`` with ``-g``/``-lineinfo``) where nvcc and a CUDA torch
are there.

    .venv/bin/python bench/relocate_check.py [--json FILE]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import struct
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CPP = """
#include <torch/extension.h>
#include "local.h"
int value() { TORCH_CHECK(LOCAL > 0, "bad value at ", __FILE__); return LOCAL; }
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("value", &value); }
"""

CU_HOST = """
#include <torch/extension.h>
int value();
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("value", &value); }
"""

CU = """
#include <cuda_runtime.h>
#include "local.h"
__global__ void put(int* out) { out[threadIdx.x] = LOCAL + threadIdx.x; }
int value() {
  int* d; int h = 0;
  cudaMalloc(&d, 4 * sizeof(int)); put<<<1, 4>>>(d);
  cudaMemcpy(&h, d, sizeof(int), cudaMemcpyDeviceToHost); cudaFree(d);
  return h;
}
"""

CHILD = """
import json, sys, opforge
src, inc, flags, cuda_flags = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4])
m = opforge.load(sys.argv[5], src.split(","), extra_include_paths=[inc], extra_cflags=flags,
                 extra_cuda_cflags=cuda_flags)
print(json.dumps({"file": m.__file__, "value": m.value()}))
"""


def sections(path: str) -> dict[str, bytes]:
    """An ELF64 little-endian file's sections by name (what `readelf -S` lists), with their bytes."""
    data = open(path, "rb").read()
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    heads = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    strtab = heads[shstrndx]
    names = data[strtab[4]:strtab[4] + strtab[5]]
    out = {}
    for h in heads:
        name = names[h[0]:names.index(b"\0", h[0])].decode()
        out[name] = b"" if h[1] == 8 else data[h[4]:h[4] + h[5]]  # SHT_NOBITS: no bytes in the file
    return out


def compare(a: str, b: str, dirs: list[str]) -> dict:
    da, db = open(a, "rb").read(), open(b, "rb").read()
    res = {"identical": da == db, "sha256": [hashlib.sha256(x).hexdigest()[:16] for x in (da, db)],
           "size": [len(da), len(db)], "names_a_dir": [d for d in dirs if d.encode() in da or d.encode() in db]}
    if da != db:
        sa, sb = sections(a), sections(b)
        res["differing_sections"] = sorted(n for n in set(sa) | set(sb) if sa.get(n) != sb.get(n))
    return res


def build(work: str, node: str, where: str, files: dict[str, str], name: str, flags, cuda_flags) -> tuple[dict, str]:
    base = os.path.join(work, node, where)
    os.makedirs(os.path.join(base, "inc"))
    for fname, text in files.items():
        with open(os.path.join(base, fname), "w") as f:
            f.write(text)
    with open(os.path.join(base, "inc", "local.h"), "w") as f:
        f.write("#define LOCAL 3\n")
    srcs = ",".join(os.path.join(base, f) for f in files)
    env = dict(os.environ, PYTHONPATH=ROOT, OPFORGE_CACHE_DIR=os.path.join(work, node, "cache"), OPFORGE_PCH="0",
               OPFORGE_CCACHE="0")
    out = subprocess.run([sys.executable, "-c", CHILD, srcs, os.path.join(base, "inc"), json.dumps(flags),
                          json.dumps(cuda_flags), name], env=env, capture_output=True, text=True, timeout=1200)
    if out.returncode != 0:
        sys.exit(out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1]), base


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args()
    sys.path.insert(0, ROOT)
    import torch

    cases = [("cpp_g", {"m.cpp": CPP}, ["-g", "-O2"], [])]
    if torch.version.cuda and subprocess.run(["which", "nvcc"], capture_output=True).returncode == 0:
        cases.append(("cuda_lineinfo", {"m.cpp": CU_HOST, "k.cu": CU}, ["-O2"], ["-lineinfo", "-O2"]))
        cases.append(("cuda_g", {"m.cpp": CU_HOST, "k.cu": CU}, ["-g"], ["-g", "-G"]))
    results = {}
    for name, files, flags, cuda_flags in cases:
        work = tempfile.mkdtemp(prefix="opforge-relocate-")
        a, base_a = build(work, "a", "ci/builds/p", files, f"reloc_{name}", flags, cuda_flags)
        b, base_b = build(work, "b", "home/u/venvs/x/p", files, f"reloc_{name}", flags, cuda_flags)
        res = compare(a["file"], b["file"], [work, os.path.dirname(torch.__file__)])
        res["same_entry"] = os.path.basename(os.path.dirname(a["file"])) == os.path.basename(os.path.dirname(b["file"]))
        res["values"] = [a["value"], b["value"]]
        results[name] = res
        print(f"{name:14s} identical={res['identical']} same entry={res['same_entry']} sha256={res['sha256']} "
              f"names a dir={res['names_a_dir'] or 'no'} differing={res.get('differing_sections', [])}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
