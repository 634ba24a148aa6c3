// What the L2 placement probes share (`l2_partition_probe.cu`, `l2_fill_probe.cu`,
// `l2_warm_probe.cu`): the SM a thread runs on, a streaming reader, the pointer chase that times
// one SM's L2 hits on lines another SM read in (from which the two L2 partitions are told apart),
// and the device's set-up with its flush.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <vector>

#include "probe.h"

__device__ inline uint32_t smid() {
  uint32_t s;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
  return s;
}

// Block b (shifted by `shift` modulo the grid) streams slice b of n uint4, 4 loads in flight a
// thread.
__global__ void reader(const uint4* __restrict__ w, uint64_t n, uint32_t shift, uint32_t* out) {
  uint32_t b = (blockIdx.x + shift) % gridDim.x;
  uint64_t per = (n + gridDim.x - 1) / gridDim.x;
  uint64_t lo = b * per, hi = min(n, lo + per);
  uint32_t acc = 0;
  for (uint64_t i = lo + threadIdx.x; i < hi; i += 4 * blockDim.x) {
    uint4 v[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      uint64_t j = i + u * blockDim.x;
      v[u] = j < hi ? w[j] : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  if (acc == 0x12345678u) out[blockIdx.x] = acc;
}

// The block that runs on SM `target` (if any) chases the chain once (reading its lines in),
// then, if `timed`, again, and writes the mean cycles a hop of the second chase.
__global__ void chase(const uint64_t* chain, uint32_t hops, uint32_t target, int timed,
                      double* cycles, int* found) {
  if (smid() != target || threadIdx.x != 0) return;
  if (atomicCAS(found, 0, 1) != 0) return;  // one block of the SM chases
  uint64_t i = 0;
  for (int pass = 0; pass < 1 + timed; ++pass) {
    long long t0 = clock64();
    for (uint32_t h = 0; h < hops; ++h) {
      uint64_t next;
      asm volatile("ld.global.cg.u64 %0, [%1];" : "=l"(next) : "l"(chain + i));
      i = next;
    }
    long long t1 = clock64();
    if (pass == 1) cycles[0] = (double)(t1 - t0) / hops + (i == 0xFFFFFFFFFFull ? 1 : 0);
  }
  if (!timed && i == 0xFFFFFFFFFFull) cycles[0] = i;
}

// Times SM r's L2 hits on the lines SM `toucher` read in: a chain of `lines` lines 1 KiB apart
// in a random order, each case behind `flush` (which must leave L2 full of other lines).
struct ChaseTimer {
  uint64_t* chain;
  uint32_t hops;
  int sms;
  double* cycles;
  int* found;

  ChaseTimer(uint32_t lines, int sms_) : hops(lines), sms(sms_) {
    const size_t stride = 1024 / 8;
    std::vector<uint64_t> host(lines * stride, 0);
    std::vector<uint32_t> order(lines);
    for (uint32_t i = 0; i < lines; ++i) order[i] = i;
    srand(7);
    for (uint32_t i = lines - 1; i > 0; --i) std::swap(order[i], order[rand() % (i + 1)]);
    for (uint32_t i = 0; i < lines; ++i)
      host[order[i] * stride] = order[(i + 1) % lines] * stride;
    CK(cudaMalloc(&chain, host.size() * 8));
    CK(cudaMemcpy(chain, host.data(), host.size() * 8, cudaMemcpyHostToDevice));
    CK(cudaMallocManaged(&cycles, 8));
    CK(cudaMallocManaged(&found, 4));
  }

  double time(uint32_t toucher, uint32_t r, const std::function<void()>& flush) {
    for (;;) {
      flush();
      *found = 0;
      chase<<<sms * 4, 32>>>(chain, hops, toucher, 0, cycles, found);
      CK(cudaDeviceSynchronize());
      if (!*found) continue;
      *found = 0;
      chase<<<sms * 4, 32>>>(chain, hops, r, 1, cycles, found);
      CK(cudaDeviceSynchronize());
      if (*found) return *cycles;
    }
  }
};

// The device's SMs and L2, and a flush that leaves L2 full of clean lines of a buffer four
// times its size (written, then read by `reader` on `grid` x `threads`).
struct L2Setup {
  int sms = 0, l2 = 0;
  size_t flush_bytes = 0;
  uint4* flush = nullptr;
  uint32_t* out = nullptr;
  int grid = 0;
  static constexpr int threads = 512;

  L2Setup() {
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    CK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0));
    flush_bytes = (size_t)l2 * 4;
    CK(cudaMalloc(&flush, flush_bytes));
    CK(cudaMalloc(&out, 1 << 20));
    grid = sms * 2;
  }

  void flush_l2(cudaStream_t s = 0) const {
    CK(cudaMemsetAsync(flush, 3, flush_bytes, s));
    reader<<<grid, threads, 0, s>>>(flush, flush_bytes / 16, 0, out);
  }
};
