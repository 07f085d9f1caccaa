// What limits bias_act's CUDA forward against a device-to-device copy: the production kernel
// (bias_act_cuda.cuh) at several grid sizes, beside minimal kernels of the same structure (a
// copy, and bias + lrelu + clamp) with U = 1, 2 or 4 vectors in flight per thread.
//
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90,code=sm_90 --expt-relaxed-constexpr \
//        -I opforge/kernels/bias_act/csrc bench/cuda_probe/bias_act_fwd.cu -o /tmp/probe && /tmp/probe
//
// fp16, 256x512x64x64 (2^27 elements, 256 MiB each way), bias along dim 1 (inner 4096). Each
// kernel: 3 warm-up launches, then the median of 20 event-timed launches; GB/s counts bytes read
// plus bytes written. Not part of the package: a measurement for docs/benchmarks.md.

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "bias_act_cuda.cuh"

namespace k = opforge_bias_act_cuda;

#define CK(x)                                                                                 \
  do {                                                                                        \
    cudaError_t e = (x);                                                                      \
    if (e != cudaSuccess) {                                                                   \
      std::printf("%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e));           \
      std::exit(1);                                                                           \
    }                                                                                         \
  } while (0)

constexpr int64_t kN = int64_t{256} * 512 * 64 * 64;
constexpr int64_t kInner = 64 * 64, kC = 512;

// U vectors in flight a thread; Act: bias + lrelu + gain + clamp (else a copy); the channel by
// division by kInner and kC, known at compile time, or (RuntimeDiv) by the same values passed
// at run time, as the production kernel divides.
template <int U, bool Act, bool RuntimeDiv = false>
__global__ void __launch_bounds__(256) simple(const uint4* __restrict__ x, uint4* __restrict__ y,
                                              const float* __restrict__ b, int64_t nvec, int inner = kInner,
                                              int C = kC) {
  const int64_t tid = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  const int64_t nt = int64_t{gridDim.x} * blockDim.x;
  for (int64_t v = tid; v < nvec; v += U * nt) {
    uint4 in[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (v + u * nt < nvec) in[u] = x[v + u * nt];
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t vv = v + u * nt;
      if (vv >= nvec) break;
      if (Act) {
        const float bias = RuntimeDiv ? b[(static_cast<int>(vv) * 8 / inner) % C] : b[(vv * 8 / kInner) % kC];
        __half* h = reinterpret_cast<__half*>(&in[u]);
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          float f = __half2float(h[j]) + bias;
          f = (f > 0.0f ? f : 0.2f * f) * 1.4142135f;
          f = fminf(fmaxf(f, -256.0f), 256.0f);
          h[j] = __float2half_rn(f);
        }
      }
      y[vv] = in[u];
    }
  }
}

// The production walk (lrelu, fp16, int32) under other launch bounds: MINB blocks of 256 per SM.
template <int MINB>
__global__ void __launch_bounds__(256, MINB) fwd_lb(const k::Params p) {
  k::elementwise<k::F16, k::kFwd, 3, int32_t>(p);
}

template <class F>
float median_ms(F launch) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) launch();
  std::vector<float> t;
  for (int i = 0; i < 20; ++i) {
    CK(cudaEventRecord(a));
    launch();
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms);
  }
  CK(cudaGetLastError());
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

void row(const char* name, float ms) {
  std::printf("  %-44s %8.1f us  %6.0f GB/s\n", name, ms * 1e3, 2.0 * kN * 2 / (ms * 1e-3) / 1e9);
}

int main() {
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  void *x, *y;
  float* b;
  CK(cudaMalloc(&x, kN * 4));  // room for the fp32 backward below
  CK(cudaMalloc(&y, kN * 4));
  CK(cudaMalloc(&b, kC * 4));
  std::vector<__half> hx(1 << 20);
  for (size_t i = 0; i < hx.size(); ++i) hx[i] = __float2half(static_cast<float>((i * 2654435761u) % 1000) / 250.0f - 2.0f);
  for (int64_t o = 0; o < kN; o += hx.size()) CK(cudaMemcpy(static_cast<__half*>(x) + o, hx.data(), hx.size() * 2, cudaMemcpyHostToDevice));
  std::vector<float> hb(kC, 0.05f);
  CK(cudaMemcpy(b, hb.data(), kC * 4, cudaMemcpyHostToDevice));
  std::printf("fp16 256x512x64x64 forward (lrelu, gain sqrt 2, clamp 256, bias per channel), %d SMs\n", sms);

  row("cudaMemcpyAsync D2D", median_ms([&] { CK(cudaMemcpyAsync(y, x, kN * 2, cudaMemcpyDeviceToDevice)); }));
  const int64_t nvec = kN / 8;
  for (int mult : {4, 8, 16, 32}) {
    const unsigned grid = static_cast<unsigned>(sms * mult);
    char name[96];
    std::snprintf(name, sizeof name, "copy U=1, grid %d x SMs", mult);
    row(name, median_ms([&] { simple<1, false><<<grid, 256>>>((const uint4*)x, (uint4*)y, b, nvec); }));
    std::snprintf(name, sizeof name, "copy U=4, grid %d x SMs", mult);
    row(name, median_ms([&] { simple<4, false><<<grid, 256>>>((const uint4*)x, (uint4*)y, b, nvec); }));
    for (int u : {1, 2, 4}) {
      std::snprintf(name, sizeof name, "bias+lrelu U=%d, grid %d x SMs", u, mult);
      auto go = [&] {
        if (u == 1) simple<1, true><<<grid, 256>>>((const uint4*)x, (uint4*)y, b, nvec);
        if (u == 2) simple<2, true><<<grid, 256>>>((const uint4*)x, (uint4*)y, b, nvec);
        if (u == 4) simple<4, true><<<grid, 256>>>((const uint4*)x, (uint4*)y, b, nvec);
      };
      row(name, median_ms(go));
    }
  }
  const unsigned oneshot = static_cast<unsigned>((nvec + 511) / 512);
  row("bias+lrelu U=2, one-shot grid", median_ms([&] {
        simple<2, true><<<oneshot, 256>>>((const uint4*)x, (uint4*)y, b, nvec);
      }));

  row("simple U=2 with runtime division, one-shot", median_ms([&] {
        simple<2, true, true><<<oneshot, 256>>>((const uint4*)x, (uint4*)y, b, nvec, (int)kInner, (int)kC);
      }));
  for (int minb : {4, 6, 8}) {
    for (int64_t grid : {int64_t(oneshot), int64_t(sms) * minb, int64_t(sms) * 16}) {
      k::Params p{};
      p.in[0] = x;
      p.b = b;
      p.b_dtype = k::kF32;
      p.out = y;
      p.n = kN;
      p.channels = kC;
      p.inner = kInner;
      p.alpha = 0.2f;
      p.gain = 1.4142135f;
      p.clamp = 256.0f;
      p.clamp_ref = -1.0f;
      p.bias_kind = k::kPerVec;
      p.aligned = 1 | 8;
      const int64_t stride = grid * 256 * 8;
      p.step_r = stride % kInner;
      p.step_c = (stride / kInner) % kC;
      char name[96];
      std::snprintf(name, sizeof name, "production walk, launch bounds (256, %d), grid %lld", minb, (long long)grid);
      auto go = [&] {
        if (minb == 4) fwd_lb<4><<<(unsigned)grid, 256>>>(p);
        if (minb == 6) fwd_lb<6><<<(unsigned)grid, 256>>>(p);
        if (minb == 8) fwd_lb<8><<<(unsigned)grid, 256>>>(p);
      };
      row(name, median_ms(go));
    }
  }

  // The production kernel, through plan() and launch(), then at other grid sizes.
  k::Plan plan;
  CK(k::plan(k::kFwd, k::kF16, 3, kN, kC, kInner, false, 0, &plan));
  std::printf("  production plan: grid %u (%.1f x SMs)\n", plan.grid_x, plan.grid_x / double(sms));
  row("production kernel, its plan", median_ms([&] {
        CK(k::launch(plan, k::kFwd, k::kF16, x, nullptr, nullptr, b, k::kF32, y, nullptr, k::kF32, nullptr, kN,
                     kC, kInner, 0.2f, 1.4142135f, 256.0f, -1.0f, 0));
      }));
  for (int mult : {8, 16, 32, 64}) {
    k::Plan p2 = plan;
    p2.grid_x = static_cast<unsigned>(sms * mult);
    char name[96];
    std::snprintf(name, sizeof name, "production kernel, grid %d x SMs", mult);
    row(name, median_ms([&] {
          CK(k::launch(p2, k::kFwd, k::kF16, x, nullptr, nullptr, b, k::kF32, y, nullptr, k::kF32, nullptr, kN,
                       kC, kInner, 0.2f, 1.4142135f, 256.0f, -1.0f, 0));
        }));
  }

  // The backward walks that sum db (lrelu from y, dx and db), their plan against larger grids:
  // rows (NCHW, inner 4096) and cols (channels last, inner 1, 512 channels). Bytes: dy and y
  // read, dx written (the finish kernel's partial sums not counted).
  void* dy;
  void* db;
  CK(cudaMalloc(&dy, kN * 4));
  CK(cudaMalloc(&db, kC * 4));
  CK(cudaMemcpy(dy, x, kN * 2, cudaMemcpyDeviceToDevice));
  CK(cudaMemcpy(static_cast<char*>(dy) + kN * 2, x, kN * 2, cudaMemcpyDeviceToDevice));
  float* scratch = nullptr;
  CK(cudaMalloc(&scratch, int64_t{256} << 20));  // 1 GiB of fp32 partial sums, more than any plan here
  auto brow = [&](const char* name, float ms, int es) {
    std::printf("  %-44s %8.1f us  %6.0f GB/s\n", name, ms * 1e3, 3.0 * kN * es / (ms * 1e-3) / 1e9);
  };
  for (int dt : {k::kF16, k::kF32}) {
    const int es = dt == k::kF16 ? 2 : 4;
    std::printf("%s backward with db (lrelu from y)\n", dt == k::kF16 ? "fp16" : "fp32");
    for (int64_t inner : {kInner, int64_t{1}}) {
      k::Plan bp;
      CK(k::plan(k::kBwdY, dt, 3, kN, kC, inner, true, 0, &bp));
      auto run = [&](const k::Plan& pl) {
        CK(k::launch(pl, k::kBwdY, dt, dy, x, nullptr, nullptr, k::kF32, y, db, k::kF32, scratch, kN, kC, inner,
                     0.2f, 1.4142135f, -1.0f, -1.0f, 0));
      };
      char name[96];
      std::snprintf(name, sizeof name, "%s walk, its plan (grid %u x %u)", bp.walk == k::kRows ? "rows" : "cols",
                    bp.grid_x, bp.grid_y);
      brow(name, median_ms([&] { run(bp); }), es);
      for (int mult : {2, 4, 16, 64}) {
        k::Plan b2 = bp;
        if (bp.walk == k::kRows) {
          const int64_t G = int64_t{1} << bp.glog;
          const int64_t most = (bp.units * G + 255) / 256;
          const int64_t want = int64_t{bp.grid_x} * mult;
          if (want > most * 2) break;
          b2.grid_x = static_cast<unsigned>(want < most ? want : most);
        } else {
          const int64_t most = (bp.col_rows + 7) / 8;
          const int64_t want = int64_t{bp.grid_y} * mult;
          if (want > most * 2 || want * bp.width > (int64_t{256} << 20)) break;
          b2.grid_y = static_cast<unsigned>(want < most ? want : most);
        }
        std::snprintf(name, sizeof name, "  grid %u x %u", b2.grid_x, b2.grid_y);
        brow(name, median_ms([&] { run(b2); }), es);
      }
    }
  }
  return 0;
}
