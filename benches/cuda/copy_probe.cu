// A CUDA C++ probe, not part of the build: what a plain SM kernel reaches against cudaMemcpy
// device-to-device on this GPU, for a copy of 1 GiB and a gather of 4 Mi random 256-byte rows
// from a 4 GiB table, over launch shapes and unrolls. The peer the gather bench compares with.
// On a machine with nvcc (the GPU machine):
//   nvcc -O3 -arch=sm_90 -std=c++17 benches/cuda/copy_probe.cu -o /tmp/copy_probe && /tmp/copy_probe
#include <cstdio>
#include <cstdint>
#include <vector>
#include <algorithm>
#include <random>
#define CK(x) do { cudaError_t e = (x); if (e) { printf("err %s line %d\n", cudaGetErrorString(e), __LINE__); return 1; } } while (0)

template <int U, int MODE>  // MODE 0 plain, 1 streaming (__ldcs/__stcs), 2 ldg + stcs
__global__ void copy_warp(const int4* __restrict__ in, int4* __restrict__ out, size_t n16) {
  size_t warp = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
  size_t warps = (gridDim.x * (size_t)blockDim.x) / 32;
  for (size_t base = warp * 32 * U; base < n16; base += warps * 32 * U) {
    int4 v[U];
#pragma unroll
    for (int j = 0; j < U; j++) { size_t i = base + j * 32 + lane; if (i < n16) v[j] = MODE == 1 ? __ldcs(in + i) : __ldg(in + i); }
#pragma unroll
    for (int j = 0; j < U; j++) { size_t i = base + j * 32 + lane; if (i < n16) { if (MODE >= 1) __stcs(out + i, v[j]); else out[i] = v[j]; } }
  }
}

template <int U, int MODE>  // rows of 256 B = 16 chunks; a warp does 2 rows per 32 chunks
__global__ void gather_warp(const int4* __restrict__ table, const int64_t* __restrict__ ids, int4* __restrict__ out, size_t n) {
  size_t n16 = n * 16;
  size_t warp = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
  size_t warps = (gridDim.x * (size_t)blockDim.x) / 32;
  for (size_t base = warp * 32 * U; base < n16; base += warps * 32 * U) {
    int4 v[U];
#pragma unroll
    for (int j = 0; j < U; j++) { size_t i = base + j * 32 + lane; if (i < n16) { int64_t r = __ldg(ids + i / 16); v[j] = MODE == 1 ? __ldcs(table + r * 16 + i % 16) : __ldg(table + r * 16 + i % 16); } }
#pragma unroll
    for (int j = 0; j < U; j++) { size_t i = base + j * 32 + lane; if (i < n16) { if (MODE >= 1) __stcs(out + i, v[j]); else out[i] = v[j]; } }
  }
}

template <typename F> float time_ms(F f, int reps = 15) {
  cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
  f(); cudaDeviceSynchronize();
  std::vector<float> t;
  for (int r = 0; r < reps; r++) { cudaEventRecord(a); f(); cudaEventRecord(b); cudaEventSynchronize(b); float ms; cudaEventElapsedTime(&ms, a, b); t.push_back(ms); }
  std::sort(t.begin(), t.end()); return t[t.size() / 2];
}

int main() {
  int sms; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  size_t bytes = 1ull << 30, n16 = bytes / 16;
  int4 *a, *b, *table; int64_t* ids;
  size_t rows = (4ull << 30) / 256, n = 4ull << 20;
  CK(cudaMalloc(&a, bytes)); CK(cudaMalloc(&b, bytes)); CK(cudaMalloc(&table, 4ull << 30)); CK(cudaMalloc(&ids, n * 8));
  cudaMemset(a, 1, bytes); cudaMemset(table, 2, 4ull << 30);
  std::vector<int64_t> h(n); std::mt19937_64 g(7); for (auto& x : h) x = g() % rows;
  cudaMemcpy(ids, h.data(), n * 8, cudaMemcpyHostToDevice);
  float memcpy_ms = time_ms([&] { cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice); });
  double peer = 2.0 * bytes / (memcpy_ms * 1e-3) / 1e9;
  printf("cudaMemcpy D2D 1 GiB: %.1f GB/s\n", peer);
  auto report = [&](const char* what, int blocks, int threads, float ms, double moved) {
    double bw = moved / (ms * 1e-3) / 1e9; printf("%-28s %5d x %4d: %8.1f GB/s  %.3f x memcpy\n", what, blocks, threads, bw, bw / peer); };
#define COPY(U, M) for (int bps : {1, 2, 4, 8, 16}) for (int th : {256, 512}) { int bl = sms * bps * 256 / th; if (bl * th > sms * 2048) continue; \
    report("copy U" #U " mode" #M, bl, th, time_ms([&] { copy_warp<U, M><<<bl, th>>>(a, b, n16); }), 2.0 * bytes); }
  COPY(1, 0) COPY(2, 0) COPY(4, 0) COPY(8, 0) COPY(4, 1) COPY(4, 2) COPY(8, 2)
#define GATHER(U, M) for (int bps : {2, 4, 8}) { int th = 256; int bl = sms * bps; \
    report("gather U" #U " mode" #M, bl, th, time_ms([&] { gather_warp<U, M><<<bl, th>>>(table, ids, b, n); }), 2.0 * n * 256 + 8.0 * n); }
  GATHER(1, 0) GATHER(2, 0) GATHER(4, 0) GATHER(4, 2) GATHER(8, 2)
  CK(cudaGetLastError());
  return 0;
}
