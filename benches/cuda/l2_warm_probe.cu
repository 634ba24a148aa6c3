// A CUDA C++ probe, not part of the build: how much of a warm reader's speed lines warmed by
// another kernel give, by who warmed them. A reader streams W bytes (4 uint4 loads in flight a
// thread, a block per SM slot). Cases, each timed with events on one stream, medians of reps:
//   cold        after a flush (a write of 4 x L2)
//   warm        right after the same reader (its own lines, its own SMs)
//   loads       after l2_prefetch_loads-like reads by every SM, block b reading the b-th slice
//   loads-rev   the same, the slices in reverse block order (other SMs than the reader's)
//   loads-2x    both of the above (every line read from two SMs)
//   bulk        after cp.async.bulk.prefetch.L2 of 16 KiB chunks from 8 blocks
//   reader-2x   the reader itself, twice, with its blocks shifted by half a grid, then the reader
//   loads+26us  loads, then a 26 us spin of 4 blocks (a collective), then the reader
//   loads||26us the loads on a second stream beside that spin
//   *-clean     cold, loads and bulk after a flush whose dirty lines were evicted by reads (L2
//               full of clean lines, as a decode step's earlier readers leave it)
// On the GPU machine:
//   nvcc -O3 -arch=sm_90 -std=c++17 benches/cuda/l2_warm_probe.cu -o /tmp/lw && /tmp/lw
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "l2_probe.h"

// ld.global.nc reads of slice (b or reversed b), 8 in flight a thread; the values folded into a
// word stored only if it matches a magic number, so that ptxas keeps every load.
__global__ void loads(const uint4* __restrict__ w, uint64_t n, int reverse, uint32_t* out) {
  uint32_t b = reverse ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
  uint64_t per = (n + gridDim.x - 1) / gridDim.x;
  uint64_t lo = b * per, hi = min(n, lo + per);
  uint32_t acc = 0;
  for (uint64_t i = lo + threadIdx.x; i < hi; i += 8 * blockDim.x) {
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      uint64_t j = i + u * blockDim.x;
      if (j < hi) {
        uint32_t x, y, z, q;
        asm volatile("ld.global.nc.v4.u32 {%0,%1,%2,%3}, [%4];"
                     : "=r"(x), "=r"(y), "=r"(z), "=r"(q)
                     : "l"(w + j));
        acc ^= x ^ y ^ z ^ q;
      }
    }
  }
  if (acc == 0x9E3779B9u) out[blockIdx.x] = acc;
}

__global__ void spin(uint64_t ns) {
  uint64_t t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < ns);
}

__global__ void bulk(const char* w, uint64_t bytes) {
  const uint64_t chunk = 16 << 10;
  for (uint64_t off = (blockIdx.x * (uint64_t)blockDim.x + threadIdx.x) * chunk; off < bytes;
       off += (uint64_t)gridDim.x * blockDim.x * chunk) {
    uint32_t len = (uint32_t)min(chunk, bytes - off);
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(w + off), "r"(len)
                 : "memory");
  }
}

int main(int argc, char** argv) {
  size_t mib = argc > 1 ? atoi(argv[1]) : 24;
  int reps = argc > 2 ? atoi(argv[2]) : 21;
  size_t bytes = mib << 20;
  uint64_t n = bytes / 16;
  int sms;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  int l2;
  CK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0));
  uint4* w;
  CK(cudaMalloc(&w, bytes));
  CK(cudaMemset(w, 1, bytes));
  size_t flush_bytes = (size_t)l2 * 4;
  void* flush;
  CK(cudaMalloc(&flush, flush_bytes));
  uint32_t* out;
  CK(cudaMalloc(&out, 1 << 20));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaStream_t s2;
  CK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
  cudaEvent_t a, b, f;
  CK(cudaEventCreateWithFlags(&f, cudaEventDisableTiming));
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  const int grid = sms * 2, threads = 512;
  const char* names[] = {"cold", "warm", "loads", "loads-rev", "loads-2x", "bulk", "reader-2x",
                         "loads+26us", "loads||26us", "cold-clean", "loads-clean", "bulk-clean"};
  const int cases = 12;
  std::vector<float> t[cases];
  for (int r = 0; r < reps; ++r) {
    for (int c = 0; c < cases; ++c) {
      CK(cudaMemsetAsync(flush, r, flush_bytes, s));
      // The clean cases then read the flush buffer: L2 left full of clean lines, as a decode
      // step's earlier readers leave it.
      if (c >= 9) reader<<<grid, threads, 0, s>>>((const uint4*)flush, flush_bytes / 16, 0, out);
      switch (c) {
        case 1: reader<<<grid, threads, 0, s>>>(w, n, 0, out); break;
        case 2: loads<<<sms, 1024, 0, s>>>(w, n, 0, out); break;
        case 3: loads<<<sms, 1024, 0, s>>>(w, n, 1, out); break;
        case 4:
          loads<<<sms, 1024, 0, s>>>(w, n, 0, out);
          loads<<<sms, 1024, 0, s>>>(w, n, 1, out);
          break;
        case 5: bulk<<<8, 64, 0, s>>>((const char*)w, bytes); break;
        case 6:
          reader<<<grid, threads, 0, s>>>(w, n, grid / 2, out);
          reader<<<grid, threads, 0, s>>>(w, n, 0, out);
          break;
        case 7:
          loads<<<sms, 1024, 0, s>>>(w, n, 0, out);
          spin<<<4, 32, 0, s>>>(26000);
          break;
        case 10: loads<<<sms, 1024, 0, s>>>(w, n, 0, out); break;
        case 11: bulk<<<8, 64, 0, s>>>((const char*)w, bytes); break;
        case 8:  // the loads beside a 26 us collective, on a second stream
          CK(cudaEventRecord(f, s));
          CK(cudaStreamWaitEvent(s2, f, 0));
          loads<<<sms, 1024, 0, s2>>>(w, n, 0, out);
          spin<<<4, 32, 0, s>>>(26000);
          break;
      }
      CK(cudaStreamSynchronize(s2));
      CK(cudaEventRecord(a, s));
      reader<<<grid, threads, 0, s>>>(w, n, 0, out);
      CK(cudaEventRecord(b, s));
      CK(cudaEventSynchronize(b));
      float ms;
      CK(cudaEventElapsedTime(&ms, a, b));
      t[c].push_back(ms * 1e3f);
    }
  }
  printf("reader of %zu MiB, %d blocks x %d threads; L2 %d MiB; median of %d\n", mib, grid,
         threads, l2 >> 20, reps);
  float med[cases];
  for (int c = 0; c < cases; ++c) {
    std::sort(t[c].begin(), t[c].end());
    med[c] = t[c][t[c].size() / 2];
  }
  for (int c = 0; c < cases; ++c)
    printf("  %-11s %7.2f us  (share of cold - warm: %.2f; of cold-clean - warm: %.2f)\n",
           names[c], med[c], (med[0] - med[c]) / (med[0] - med[1]),
           (med[9] - med[c]) / (med[9] - med[1]));
  return 0;
}
