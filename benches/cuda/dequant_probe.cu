// A CUDA C++ probe, not part of the build: where the time of a gather + MXFP8 dequant of 4 Mi
// random 256-element rows from a 4 GiB table goes on this GPU. The same warp layout as the
// crate's Units8 variants (a lane per 8 elements, each warp store 512 contiguous bytes), with
// one part left out or changed per mode, against cudaMemcpy of the same table bytes.
// On the GPU machine:
//   nvcc -O3 -arch=sm_90 -std=c++17 benches/cuda/dequant_probe.cu -o /tmp/dq && /tmp/dq
#include <cstdio>
#include <cstdint>
#include <vector>
#include <random>
#include <algorithm>
#include <cuda_bf16.h>
#define CK(x) do { cudaError_t e = (x); if (e) { printf("err %s line %d\n", cudaGetErrorString(e), __LINE__); return 1; } } while (0)

__device__ __forceinline__ uint32_t place(uint32_t lanes) { return (lanes & 0x80008000u) | ((lanes & 0x7F007F00u) >> 4); }
__device__ __forceinline__ uint32_t mulbf(uint32_t a, uint32_t b) {
  __nv_bfloat162 x = *reinterpret_cast<__nv_bfloat162*>(&a), y = *reinterpret_cast<__nv_bfloat162*>(&b);
  __nv_bfloat162 r = __hmul2(x, y); return *reinterpret_cast<uint32_t*>(&r);
}
__device__ __forceinline__ uint4 convert(uint2 w, uint8_t s) {
  uint32_t one = s == 0 ? 0x40u : (uint32_t)s << 7, sc = one | one << 16;
  uint32_t o[4]; uint32_t in[2] = {w.x, w.y};
#pragma unroll
  for (int k = 0; k < 2; k++) {
    uint32_t lo = place(__byte_perm(in[k], 0, 0x1404)), hi = place(__byte_perm(in[k], 0, 0x3424));
    uint32_t nan = (((in[k] & 0x7F7F7F7Fu) + 0x01010101u) & 0x80808080u) | (s == 0xFF ? 0x80808080u : 0);
    uint32_t ml = __byte_perm(nan, 0, 0x9988), mh = __byte_perm(nan, 0, 0xBBAA);
    o[2 * k] = (mulbf(mulbf(lo, 0x7B807B80u), sc) & ~ml) | (0x7FFF7FFFu & ml);
    o[2 * k + 1] = (mulbf(mulbf(hi, 0x7B807B80u), sc) & ~mh) | (0x7FFF7FFFu & mh);
  }
  return make_uint4(o[0], o[1], o[2], o[3]);
}

// MODE 0: full. 1: no scale load. 2: no weight load (scale and id only). 3: write only (ids
// loaded). 4: scale read at the output row (sequential) instead of the id's. 5: full, streaming
// stores. 6: full, weights loaded 16 bytes a lane (chunk layout: two stores 16 bytes apart).
template <int U, int MODE>
__global__ void __launch_bounds__(256) probe(const uint8_t* __restrict__ w, const uint8_t* __restrict__ sc,
                                             const int64_t* __restrict__ ids, uint4* __restrict__ out, uint64_t n) {
  uint64_t total = n * 32, lane = threadIdx.x % 32;
  uint64_t warps = gridDim.x * (uint64_t)blockDim.x / 32;
  for (uint64_t tile = (blockIdx.x * (uint64_t)blockDim.x + threadIdx.x) / 32; tile * 32 * U < total; tile += warps) {
    uint64_t base = tile * 32 * U + lane;
    int64_t id[U]; uint2 v[U]; uint8_t s[U];
#pragma unroll
    for (int j = 0; j < U; j++) { uint64_t u = base + 32 * j; id[j] = u < total ? __ldg(ids + (u >> 5)) : 0; }
#pragma unroll
    for (int j = 0; j < U; j++) {
      uint64_t u = base + 32 * j, c = u & 31;
      v[j] = make_uint2(0, 0); s[j] = 127;
      if (u < total) {
        if (MODE != 2 && MODE != 3) v[j] = __ldg(reinterpret_cast<const uint2*>(w + id[j] * 256 + 8 * c));
        if (MODE == 0 || MODE == 2 || MODE == 5) s[j] = __ldg(sc + id[j] * 8 + c / 4);
        if (MODE == 4) s[j] = __ldg(sc + (u >> 5) * 8 + c / 4);
        if (MODE == 3) s[j] = (uint8_t)id[j];
      }
    }
#pragma unroll
    for (int j = 0; j < U; j++) {
      uint64_t u = base + 32 * j;
      if (u < total) { uint4 o = convert(v[j], s[j]); if (MODE == 5) __stcs(out + u, o); else out[u] = o; }
    }
  }
}

template <int U> __global__ void __launch_bounds__(256) probe_chunk(const uint8_t* __restrict__ w, const uint8_t* __restrict__ sc,
                                                const int64_t* __restrict__ ids, uint4* __restrict__ out, uint64_t n) {
  uint64_t total = n * 16, stride = gridDim.x * (uint64_t)blockDim.x;
  for (uint64_t t = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; t < total; t += stride * U) {
    uint4 v[U]; uint8_t s[U];
#pragma unroll
    for (int j = 0; j < U; j++) { uint64_t q = t + j * stride; if (q < total) { int64_t id = __ldg(ids + q / 16); v[j] = __ldg(reinterpret_cast<const uint4*>(w + id * 256 + 16 * (q % 16))); s[j] = __ldg(sc + id * 8 + (q % 16) / 2); } }
#pragma unroll
    for (int j = 0; j < U; j++) { uint64_t q = t + j * stride; if (q < total) { out[2 * q] = convert(make_uint2(v[j].x, v[j].y), s[j]); out[2 * q + 1] = convert(make_uint2(v[j].z, v[j].w), s[j]); } }
  }
}

int main() {
  const uint64_t rows = (4ull << 30) / 256, n = 4ull << 20;
  uint8_t *w, *sc; int64_t* ids; uint4* out; uint8_t *cs, *cd;
  CK(cudaMalloc(&w, rows * 256)); CK(cudaMalloc(&sc, rows * 8)); CK(cudaMalloc(&ids, n * 8));
  CK(cudaMalloc(&out, n * 512)); CK(cudaMalloc(&cs, n * 256)); CK(cudaMalloc(&cd, n * 256));
  CK(cudaMemset(w, 0x3A, rows * 256)); CK(cudaMemset(sc, 120, rows * 8));
  std::mt19937_64 rng(7); std::vector<int64_t> h(n); for (auto& x : h) x = rng() % rows;
  CK(cudaMemcpy(ids, h.data(), n * 8, cudaMemcpyHostToDevice));
  int sms; CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
  auto time = [&](auto f) { f(); cudaDeviceSynchronize(); std::vector<float> t;
    for (int r = 0; r < 11; r++) { cudaEventRecord(a); for (int i = 0; i < 10; i++) f(); cudaEventRecord(b); cudaEventSynchronize(b); float ms; cudaEventElapsedTime(&ms, a, b); t.push_back(ms * 100); }
    std::sort(t.begin(), t.end()); return t[5]; };
  float copy = time([&] { cudaMemcpyAsync(cd, cs, n * 256, cudaMemcpyDeviceToDevice); });
  double bytes = n * (256 + 8 + 512 + 8.0);
  printf("copy of %llu MiB: %.1f us, %.1f GB/s (read + write)\n", (unsigned long long)(n * 256 >> 20), copy, 2.0 * n * 256 / copy / 1e3);
  auto report = [&](const char* name, float us) { printf("%-44s %8.1f us  ratio %.3f\n", name, us, bytes / us / (2.0 * n * 256 / copy)); };
  for (int per_sm : {2, 4, 8, 16}) {
    int grid = sms * per_sm; char name[96];
    snprintf(name, sizeof name, "units x1 full, %d blocks an SM", per_sm); report(name, time([&] { probe<1, 0><<<grid, 256>>>(w, sc, ids, out, n); }));
    snprintf(name, sizeof name, "units x2 full, %d blocks an SM", per_sm); report(name, time([&] { probe<2, 0><<<grid, 256>>>(w, sc, ids, out, n); }));
    snprintf(name, sizeof name, "units x4 full, %d blocks an SM", per_sm); report(name, time([&] { probe<4, 0><<<grid, 256>>>(w, sc, ids, out, n); }));
    snprintf(name, sizeof name, "units x2 no scale, %d blocks an SM", per_sm); report(name, time([&] { probe<2, 1><<<grid, 256>>>(w, sc, ids, out, n); }));
  }
  for (int gran : {0, 32}) {
    if (gran) CK(cudaDeviceSetLimit(cudaLimitMaxL2FetchGranularity, gran));
    size_t g = 0; cudaDeviceGetLimit(&g, cudaLimitMaxL2FetchGranularity); printf("-- L2 fetch granularity limit %zu\n", g);
    int grid = sms * 8;
#define RUN(U, M, name) report(name, time([&] { probe<U, M><<<grid, 256>>>(w, sc, ids, out, n); })); CK(cudaGetLastError());
    RUN(2, 0, "units x2 full");
    RUN(2, 1, "units x2 no scale load");
    RUN(2, 2, "units x2 no weight load");
    RUN(2, 3, "units x2 write only (ids read)");
    RUN(2, 4, "units x2 scales sequential");
    RUN(2, 5, "units x2 full, streaming stores");
    RUN(4, 0, "units x4 full");
    RUN(1, 0, "units x1 full");
    report("chunk16 x2 full", time([&] { probe_chunk<2><<<grid, 256>>>(w, sc, ids, out, n); }));
    report("chunk16 x1 full", time([&] { probe_chunk<1><<<grid, 256>>>(w, sc, ids, out, n); }));
    int big = (int)((n * 32 / 64 + 255) / 256);
    report("units x2 full, one block per 256 lanes' tiles", time([&] { probe<2, 0><<<big, 256>>>(w, sc, ids, out, n); }));
  }
  return 0;
}
