// A CUDA C++ probe, not part of the build: does it matter *which* SMs read a line into L2 for a
// later reader? Hopper's L2 is two partitions, each caching for the SMs of its GPCs; a line one
// SM read may serve another SM only from the far partition.
//
// Part 1, the map: for every SM r, the latency of an L2 hit (`ld.global.cg` pointer chase, one
// thread) on lines that SM 0 read in, against lines r read in itself. SMs far from SM 0 show a
// longer first figure.
// Part 2, what it costs a reader: a streaming reader of W MiB on every SM (4 x 16-byte loads in
// flight a thread), timed after the weights were read in by
//   cold-clean   nobody (L2 full of clean lines of another buffer)
//   warm         the reader itself
//   loads-all    every SM once (work handed out by an atomic counter)
//   loads-near   only the SMs near SM 0 (by part 1's map)
//   loads-far    only the SMs far from SM 0
//   loads-both   every line read by one near SM and one far SM
// On the GPU machine:
//   nvcc -O3 -arch=sm_90 -std=c++17 benches/cuda/l2_partition_probe.cu -o /tmp/lp && /tmp/lp 24
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "l2_probe.h"

// Blocks on SMs whose `allowed[smid]` is set take 64 KiB jobs from `counter` until none is
// left; every word read with ld.global.nc and folded so that ptxas keeps the loads.
__global__ void loads(const uint4* __restrict__ w, uint64_t n, const uint8_t* allowed,
                      uint32_t* counter, uint32_t* out) {
  if (!allowed[smid()]) return;
  __shared__ uint32_t job;
  const uint64_t per = (64 << 10) / 16;
  uint32_t acc = 0;
  for (;;) {
    if (threadIdx.x == 0) job = atomicAdd(counter, 1);
    __syncthreads();
    uint64_t lo = job * per;
    __syncthreads();
    if (lo >= n) break;
    uint64_t hi = min(n, lo + per);
    for (uint64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
      uint32_t x, y, z, q;
      asm volatile("ld.global.nc.v4.u32 {%0,%1,%2,%3}, [%4];"
                   : "=r"(x), "=r"(y), "=r"(z), "=r"(q)
                   : "l"(w + i));
      acc ^= x ^ y ^ z ^ q;
    }
  }
  if (acc == 0x9E3779B9u) out[blockIdx.x] = acc;
}

int main(int argc, char** argv) {
  size_t mib = argc > 1 ? atoi(argv[1]) : 24;
  int reps = argc > 2 ? atoi(argv[2]) : 15;
  L2Setup dev;
  const int sms = dev.sms, l2 = dev.l2, grid = dev.grid, threads = L2Setup::threads;
  uint32_t* out = dev.out;
  auto flush_l2 = [&]() { dev.flush_l2(); };

  // Part 1: a chain of 4096 lines, 1 KiB apart, in a random order.
  ChaseTimer chains(4096, sms);
  auto timed_chase = [&](uint32_t toucher, uint32_t r) { return chains.time(toucher, r, flush_l2); };
  std::vector<double> by0(sms), self(sms);
  for (int r = 0; r < sms; ++r) {
    by0[r] = timed_chase(0, r);
    self[r] = timed_chase(r, r);
  }
  double lo = 1e30, hi = 0;
  for (int r = 0; r < sms; ++r) {
    lo = std::min(lo, by0[r]);
    hi = std::max(hi, by0[r]);
  }
  double cut = (lo + hi) / 2;
  std::vector<uint8_t> near(sms), far(sms), all(sms, 1);
  int nnear = 0;
  printf("L2 %d MiB, %d SMs. L2-hit cycles a hop: SM r on lines SM 0 read / lines r read\n",
         l2 >> 20, sms);
  for (int r = 0; r < sms; ++r) {
    near[r] = by0[r] < cut;
    far[r] = !near[r];
    nnear += near[r];
    printf("  sm %3d: %6.1f / %6.1f %s\n", r, by0[r], self[r], near[r] ? "near" : "far");
  }
  printf("near SM 0: %d SMs, far: %d (cut %.1f cycles)\n", nnear, sms - nnear, cut);

  // Part 2.
  size_t bytes = mib << 20;
  uint64_t n = bytes / 16;
  uint4* w;
  CK(cudaMalloc(&w, bytes));
  CK(cudaMemset(w, 1, bytes));
  uint8_t *d_near, *d_far, *d_all;
  CK(cudaMalloc(&d_near, sms));
  CK(cudaMalloc(&d_far, sms));
  CK(cudaMalloc(&d_all, sms));
  CK(cudaMemcpy(d_near, near.data(), sms, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d_far, far.data(), sms, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d_all, all.data(), sms, cudaMemcpyHostToDevice));
  uint32_t* counter;
  CK(cudaMalloc(&counter, 4));
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  auto run_loads = [&](const uint8_t* allowed) {
    CK(cudaMemset(counter, 0, 4));
    loads<<<sms * 2, 1024>>>(w, n, allowed, counter, out);
  };
  const char* names[] = {"cold-clean", "warm", "loads-all", "loads-near", "loads-far",
                         "loads-both"};
  const int cases = 6;
  std::vector<float> t[cases];
  for (int r = 0; r < reps; ++r) {
    for (int c = 0; c < cases; ++c) {
      flush_l2();
      switch (c) {
        case 1: reader<<<grid, threads>>>(w, n, 0, out); break;
        case 2: run_loads(d_all); break;
        case 3: run_loads(d_near); break;
        case 4: run_loads(d_far); break;
        case 5:
          run_loads(d_near);
          run_loads(d_far);
          break;
      }
      CK(cudaEventRecord(a));
      reader<<<grid, threads>>>(w, n, 0, out);
      CK(cudaEventRecord(b));
      CK(cudaEventSynchronize(b));
      float ms;
      CK(cudaEventElapsedTime(&ms, a, b));
      t[c].push_back(ms * 1e3f);
    }
  }
  float med[cases];
  for (int c = 0; c < cases; ++c) {
    std::sort(t[c].begin(), t[c].end());
    med[c] = t[c][t[c].size() / 2];
  }
  printf("reader of %zu MiB, %d x %d; median of %d\n", mib, grid, threads, reps);
  for (int c = 0; c < cases; ++c)
    printf("  %-11s %7.2f us  (share of cold-clean - warm: %.2f)\n", names[c], med[c],
           (med[0] - med[c]) / (med[0] - med[1]));
  return 0;
}
