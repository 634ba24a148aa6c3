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
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x)                                                      \
  do {                                                             \
    cudaError_t e = (x);                                           \
    if (e) {                                                       \
      printf("err %s line %d\n", cudaGetErrorString(e), __LINE__); \
      exit(1);                                                     \
    }                                                              \
  } while (0)

__device__ uint32_t smid() {
  uint32_t s;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
  return s;
}

// The block that runs on SM `target` (if any) chases the chain once (reading its lines in),
// then, if `timed`, again, and writes the mean cycles a hop of the second chase.
__global__ void chase(const uint64_t* chain, uint32_t hops, uint32_t target, int timed,
                      double* cycles, int* found) {
  if (smid() != target || threadIdx.x != 0) return;
  if (atomicCAS(found, 0, 1) != 0) return;  // one block of the SM chases
  uint64_t i = 0;
  if (!timed) {
    for (uint32_t h = 0; h < hops; ++h) {
      uint64_t next;
      asm volatile("ld.global.cg.u64 %0, [%1];" : "=l"(next) : "l"(chain + i));
      i = next;
    }
    if (i == 0xFFFFFFFFFFull) cycles[0] = i;
    return;
  }
  long long t0 = clock64();
  for (uint32_t h = 0; h < hops; ++h) {
    uint64_t next;
    asm volatile("ld.global.cg.u64 %0, [%1];" : "=l"(next) : "l"(chain + i));
    i = next;
  }
  long long t1 = clock64();
  cycles[0] = (double)(t1 - t0) / hops + (i == 0xFFFFFFFFFFull ? 1 : 0);
}

// Streams n uint4, block b slice b, 4 loads in flight a thread.
__global__ void reader(const uint4* __restrict__ w, uint64_t n, uint32_t* out) {
  uint64_t per = (n + gridDim.x - 1) / gridDim.x;
  uint64_t lo = blockIdx.x * per, hi = min(n, lo + per);
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
  int sms, l2;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  CK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0));
  size_t flush_bytes = (size_t)l2 * 4;
  uint4* flush;
  CK(cudaMalloc(&flush, flush_bytes));
  uint32_t* out;
  CK(cudaMalloc(&out, 1 << 20));
  double* cycles;
  CK(cudaMallocManaged(&cycles, 8));
  int* found;
  CK(cudaMallocManaged(&found, 4));
  const int grid = sms * 2, threads = 512;
  auto flush_l2 = [&]() {
    CK(cudaMemset(flush, 3, flush_bytes));
    reader<<<grid, threads>>>(flush, flush_bytes / 16, out);
  };

  // Part 1: a chain of 4096 lines, 1 KiB apart, in a random order.
  const uint32_t lines = 4096, hops = 4096;
  const size_t stride = 1024 / 8;
  std::vector<uint64_t> host(lines * stride, 0);
  std::vector<uint32_t> order(lines);
  for (uint32_t i = 0; i < lines; ++i) order[i] = i;
  srand(7);
  for (uint32_t i = lines - 1; i > 0; --i) std::swap(order[i], order[rand() % (i + 1)]);
  for (uint32_t i = 0; i < lines; ++i)
    host[order[i] * stride] = order[(i + 1) % lines] * stride;
  uint64_t* chain;
  CK(cudaMalloc(&chain, host.size() * 8));
  CK(cudaMemcpy(chain, host.data(), host.size() * 8, cudaMemcpyHostToDevice));
  auto timed_chase = [&](uint32_t toucher, uint32_t r) -> double {
    for (;;) {
      flush_l2();
      *found = 0;
      chase<<<sms * 4, 32>>>(chain, hops, toucher, 0, cycles, found);
      CK(cudaDeviceSynchronize());
      if (!*found) continue;
      *found = 0;
      chase<<<sms * 4, 32>>>(chain, hops, r, 1, cycles, found);
      CK(cudaDeviceSynchronize());
      if (*found) return *cycles;
    }
  };
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
        case 1: reader<<<grid, threads>>>(w, n, out); break;
        case 2: run_loads(d_all); break;
        case 3: run_loads(d_near); break;
        case 4: run_loads(d_far); break;
        case 5:
          run_loads(d_near);
          run_loads(d_far);
          break;
      }
      CK(cudaEventRecord(a));
      reader<<<grid, threads>>>(w, n, out);
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
