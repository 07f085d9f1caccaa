# Does nvcc put the source path into the object? The same .cu at two paths, given absolutely and relatively.
set -e
W=$(mktemp -d)
for n in a/ci/builds/p b/home/u/venvs/x/p; do
  mkdir -p $W/$n/csrc $W/$n/inc
  cat > $W/$n/csrc/k.cu <<'CU'
#include "local.h"
namespace { __device__ int twice(int x) { return 2 * x; } }
__global__ void put(int* out) { out[threadIdx.x] = twice(LOCAL) + threadIdx.x; }
int launch(int* d) { put<<<1, 4>>>(d); return 0; }
CU
  echo "#define LOCAL 3" > $W/$n/inc/local.h
done
for mode in abs rel; do
  for n in a/ci/builds/p b/home/u/venvs/x/p; do
    cd $W/$n
    if [ $mode = abs ]; then src=$W/$n/csrc/k.cu; else src=csrc/k.cu; fi
    nvcc -c $src -I inc -lineinfo -O2 -gencode=arch=compute_90,code=sm_90 -Xcompiler -fPIC -Xcompiler -ffile-prefix-map=$W/$n=. -o $W/$n/k-$mode.o
  done
  if cmp -s $W/a/ci/builds/p/k-$mode.o $W/b/home/u/venvs/x/p/k-$mode.o; then echo "$mode: identical"; else echo "$mode: differ"; 
    for f in $W/a/ci/builds/p/k-$mode.o $W/b/home/u/venvs/x/p/k-$mode.o; do strings $f | grep -E "GLOBAL__N|$W|k\.cu|module_id" | head -5; done; fi
done
