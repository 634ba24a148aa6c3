// A CUDA C++ probe, not part of the build: can a small grid put a reader's weights into both L2
// partitions as well as `l2_prefetch_loads` does (a block of 1024 threads on up to every SM), and
// how much later does a kernel launched beside each fill start in a replayed graph (issue 22: the
// collective starts 0.39 us later beside the plan's 116-block prefetch, 0.20 us beside 32)?
//
// Part 1, the map: each SM's L2-hit latency on lines SM 0 read (as `l2_partition_probe.cu`),
// split into near and far at the midpoint.
// Part 2, each fill after a flush that leaves L2 full of clean lines, W MiB, every byte read once
// by a block of each partition (per-partition job counters, at most B blocks a partition):
//   loads/B     1024 threads a block, 8 x 16-byte `ld.global.nc` in flight a thread (the plan's)
//   bulk/B      32 threads a block, each lane a `cp.async.bulk.prefetch.L2` of 16 KiB
//   tma/B       32 threads a block, lane 0 keeps 8 bulk copies of 16 KiB global -> shared in
//               flight (`cp.async.bulk.shared::cluster.global`, an mbarrier a slot); tma3/B
//               3 of them (48 KiB, what a static shared buffer holds), several blocks an SM
// timed alone (the fill's own microseconds), then the streaming reader after it (its share of
// cold - warm).
// Part 3, the sibling's delay: a graph of 64 windows, each a 20 us spin, then a fork (the fill's
// node first, as the plan captures it), then a one-block kernel standing for the collective, which
// records when it starts; the median over windows and replays of (its start - the spin's end), by
// %globaltimer, for each fill and for no fork at all.
// On the GPU machine:
//   nvcc -O3 -arch=sm_90 -std=c++17 benches/cuda/l2_fill_probe.cu -o /tmp/fp && /tmp/fp 24
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "l2_probe.h"

__device__ uint64_t now_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Per-partition claims: [0..2) job counters, [2..4) blocks admitted, [4] blocks done.
struct Claims {
  uint32_t job[2];
  uint32_t admitted[2];
  uint32_t done;
};

// Admits the block if its partition has fewer than `limit` blocks; returns the partition or -1.
__device__ int admit(const uint8_t* far, Claims* c, uint32_t limit) {
  __shared__ int part;
  if (threadIdx.x == 0) {
    int p = far[smid()];
    part = atomicAdd(&c->admitted[p], 1) < limit ? p : -1;
  }
  __syncthreads();
  return part;
}

// The last block to finish zeroes the claims for the next launch.
__device__ void finish(Claims* c) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    if (atomicAdd(&c->done, 1) == gridDim.x - 1) {
      c->job[0] = c->job[1] = 0;
      c->admitted[0] = c->admitted[1] = 0;
      c->done = 0;
      __threadfence();
    }
  }
}

// 1024 threads, 128 KiB jobs, 8 loads in flight a thread.
__global__ void fill_loads(const uint4* __restrict__ w, uint64_t n, const uint8_t* far, Claims* c,
                           uint32_t limit, uint32_t* out) {
  __shared__ uint32_t job;
  int p = admit(far, c, limit);
  uint32_t acc = 0;
  const uint64_t per = 1024 * 8;
  while (p >= 0) {
    if (threadIdx.x == 0) job = atomicAdd(&c->job[p], 1);
    __syncthreads();
    uint64_t lo = job * per;
    __syncthreads();
    if (lo >= n) break;
    uint4 v[8];
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      uint64_t j = lo + threadIdx.x + u * 1024;
      if (j < n) {
        asm volatile("ld.global.nc.v4.u32 {%0,%1,%2,%3}, [%4];"
                     : "=r"(v[u].x), "=r"(v[u].y), "=r"(v[u].z), "=r"(v[u].w)
                     : "l"(w + j));
      } else {
        v[u] = make_uint4(0, 0, 0, 0);
      }
    }
#pragma unroll
    for (int u = 0; u < 8; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  if (acc == 0x9E3779B9u) out[blockIdx.x] = acc;
  finish(c);
}

constexpr uint32_t CHUNK = 16 << 10;

// 32 threads; lane 0 claims 32 chunks a job, each lane bulk-prefetches one.
__global__ void fill_bulk(const char* w, uint64_t bytes, const uint8_t* far, Claims* c,
                          uint32_t limit) {
  int p = admit(far, c, limit);
  uint64_t chunks = bytes / CHUNK;
  while (p >= 0) {
    uint32_t job = 0;
    if (threadIdx.x == 0) job = atomicAdd(&c->job[p], 1);
    job = __shfl_sync(0xffffffffu, job, 0);
    uint64_t k = (uint64_t)job * 32 + threadIdx.x;
    if ((uint64_t)job * 32 >= chunks) break;
    if (k < chunks)
      asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(w + k * CHUNK), "r"(CHUNK)
                   : "memory");
  }
  finish(c);
}

__device__ void wait_slot(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  while (!done) {
    asm volatile(
        "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, "
        "p; }"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  }
}

// 32 threads; lane 0 keeps SLOTS bulk copies of CHUNK bytes into shared memory in flight,
// claiming 8 chunks a job.
template <int SLOTS>
__global__ void fill_tma(const char* w, uint64_t bytes, const uint8_t* far, Claims* c,
                         uint32_t limit) {
  extern __shared__ __align__(128) char buf[];
  __shared__ __align__(8) uint64_t bars[SLOTS];
  int p = admit(far, c, limit);
  if (p >= 0 && threadIdx.x == 0) {
    uint32_t buf0 = (uint32_t)__cvta_generic_to_shared(buf);
    uint32_t bar0 = (uint32_t)__cvta_generic_to_shared(bars);
    for (int s = 0; s < SLOTS; ++s)
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bar0 + 8 * s) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    uint32_t parity = 0;  // bit s: the phase slot s waits for next
    uint32_t busy = 0;
    uint64_t chunks = bytes / CHUNK;
    uint32_t issued = 0;
    for (;;) {
      uint32_t job = atomicAdd(&c->job[p], 1);
      if ((uint64_t)job * 8 >= chunks) break;
      for (uint64_t k = (uint64_t)job * 8; k < min(chunks, (uint64_t)job * 8 + 8); ++k) {
        int s = issued++ % SLOTS;
        uint32_t bar = bar0 + 8 * s;
        if (busy >> s & 1) {
          wait_slot(bar, parity >> s & 1);
          parity ^= 1u << s;
        }
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar),
                     "r"(CHUNK)
                     : "memory");
        asm volatile(
            "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, "
            "[%3];" ::"r"(buf0 + s * CHUNK),
            "l"(w + k * CHUNK), "r"(CHUNK), "r"(bar)
            : "memory");
        busy |= 1u << s;
      }
    }
    for (int s = 0; s < SLOTS; ++s)
      if (busy >> s & 1) wait_slot(bar0 + 8 * s, parity >> s & 1);
  }
  finish(c);
}

__global__ void empty_kernel() {}

// Spins for `ns`, its last thread recording when it ended.
__global__ void spin(uint64_t ns, uint64_t* end_at) {
  uint64_t t0 = now_ns();
  while (now_ns() - t0 < ns) {
  }
  if (threadIdx.x == 0) *end_at = now_ns();
}

// The stand-in collective: records when it starts, polls 2 us.
__global__ void collective(uint64_t* start_at) {
  uint64_t t0 = now_ns();
  if (threadIdx.x == 0) *start_at = t0;
  while (now_ns() - t0 < 2000) {
  }
}

int main(int argc, char** argv) {
  size_t mib = argc > 1 ? atoi(argv[1]) : 24;
  int reps = argc > 2 ? atoi(argv[2]) : 15;
  L2Setup dev;
  const int sms = dev.sms, l2 = dev.l2, grid = dev.grid, threads = L2Setup::threads;
  uint32_t* out = dev.out;
  auto flush_l2 = [&](cudaStream_t s) { dev.flush_l2(s); };

  // Part 1.
  ChaseTimer chains(2048, sms);
  std::vector<double> by0(sms);
  for (int r = 0; r < sms; ++r) by0[r] = chains.time(0, r, [&] { flush_l2(0); });
  double lo = *std::min_element(by0.begin(), by0.end());
  double hi = *std::max_element(by0.begin(), by0.end());
  std::vector<uint8_t> far(sms);
  int nfar = 0;
  for (int r = 0; r < sms; ++r) nfar += far[r] = by0[r] >= (lo + hi) / 2;
  printf("L2 %d MiB, %d SMs: %d near SM 0 (%.0f cycles), %d far (%.0f)\n", l2 >> 20, sms,
         sms - nfar, lo, nfar, hi);
  uint8_t* d_far;
  CK(cudaMalloc(&d_far, sms));
  CK(cudaMemcpy(d_far, far.data(), sms, cudaMemcpyHostToDevice));
  Claims* claims;
  CK(cudaMalloc(&claims, sizeof(Claims)));
  CK(cudaMemset(claims, 0, sizeof(Claims)));
  CK(cudaFuncSetAttribute(fill_tma<8>, cudaFuncAttributeMaxDynamicSharedMemorySize, 8 * CHUNK));
  // 3 slots are the default 48 KiB of dynamic shared memory, but the block's static barriers
  // come on top, so the launch needs the attribute as well.
  CK(cudaFuncSetAttribute(fill_tma<3>, cudaFuncAttributeMaxDynamicSharedMemorySize, 3 * CHUNK));

  // Part 2.
  size_t bytes = mib << 20;
  uint64_t n = bytes / 16;
  uint4* w;
  CK(cudaMalloc(&w, bytes));
  CK(cudaMemset(w, 1, bytes));
  struct Fill {
    std::string name;
    int kind;  // 0 none, 1 loads, 2 bulk, 3 tma (8 slots), 4 empty kernel, 5 tma (3 slots)
    uint32_t limit;
  };
  std::vector<Fill> fills = {{"cold-clean", 0, 0}, {"warm", 0, 0},      {"loads/58", 1, 58},
                             {"loads/16", 1, 16},  {"bulk/4", 2, 4},    {"bulk/16", 2, 16},
                             {"tma/8", 3, 8},      {"tma/16", 3, 16},   {"tma/32", 3, 32},
                             {"tma3/32", 5, 32},   {"tma3/58", 5, 58},  {"tma3/116", 5, 116}};
  auto launch_fill = [&](const Fill& f, cudaStream_t s) {
    switch (f.kind) {
      case 1:
        fill_loads<<<2 * f.limit + 8, 1024, 0, s>>>(w, n, d_far, claims, f.limit, out);
        break;
      case 2:
        fill_bulk<<<2 * f.limit + 8, 32, 0, s>>>((const char*)w, bytes, d_far, claims, f.limit);
        break;
      case 3:
        fill_tma<8><<<2 * f.limit + 8, 32, 8 * CHUNK, s>>>((const char*)w, bytes, d_far, claims,
                                                           f.limit);
        break;
      case 5:
        fill_tma<3><<<2 * f.limit + 8, 32, 3 * CHUNK, s>>>((const char*)w, bytes, d_far, claims,
                                                           f.limit);
        break;
      case 4:
        empty_kernel<<<1, 32, 0, s>>>();
        break;
    }
  };
  cudaEvent_t a, b, c;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  CK(cudaEventCreate(&c));
  std::vector<std::vector<float>> fill_us(fills.size()), read_us(fills.size());
  for (int r = 0; r < reps; ++r) {
    for (size_t i = 0; i < fills.size(); ++i) {
      flush_l2(0);
      CK(cudaEventRecord(a));
      if (i == 1)
        reader<<<grid, threads>>>(w, n, 0, out);
      else
        launch_fill(fills[i], 0);
      CK(cudaEventRecord(b));
      reader<<<grid, threads>>>(w, n, 0, out);
      CK(cudaEventRecord(c));
      CK(cudaEventSynchronize(c));
      float ms1, ms2;
      CK(cudaEventElapsedTime(&ms1, a, b));
      CK(cudaEventElapsedTime(&ms2, b, c));
      fill_us[i].push_back(ms1 * 1e3f);
      read_us[i].push_back(ms2 * 1e3f);
    }
  }
  auto median = [](std::vector<float> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  float cold = median(read_us[0]), warm = median(read_us[1]);
  printf("fills of %zu MiB (every byte by each partition), then a reader %d x %d; median of %d\n",
         mib, grid, threads, reps);
  for (size_t i = 0; i < fills.size(); ++i) {
    float f = median(fill_us[i]), rd = median(read_us[i]);
    printf("  %-10s fill %7.2f us (%6.0f GB/s a copy)  reader %7.2f us  share %.2f\n",
           fills[i].name.c_str(), f, i >= 2 ? bytes / (f * 1e3) : 0.0, rd,
           (cold - rd) / (cold - warm));
  }

  // Part 3.
  const int windows = 64, replays = 20;
  uint64_t* stamps;
  CK(cudaMalloc(&stamps, 2 * windows * 8));
  cudaStream_t main_s, side;
  CK(cudaStreamCreateWithFlags(&main_s, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  std::vector<cudaEvent_t> forks(windows);
  for (auto& fork : forks) CK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
  cudaEvent_t joined;
  CK(cudaEventCreateWithFlags(&joined, cudaEventDisableTiming));
  std::vector<Fill> branches = {{"no fork", 0, 0}, {"empty", 4, 0},   {"loads/58", 1, 58},
                                {"loads/16", 1, 16}, {"bulk/4", 2, 4}, {"bulk/16", 2, 16},
                                {"tma/8", 3, 8},     {"tma/16", 3, 16}, {"tma/32", 3, 32},
                                {"tma3/58", 5, 58},  {"tma3/116", 5, 116}};
  printf("a sibling's start after the spin's end, replayed (%d windows x %d replays), median / "
         "p90 us\n",
         windows, replays);
  for (const Fill& f : branches) {
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(main_s, cudaStreamCaptureModeGlobal));
    for (int k = 0; k < windows; ++k) {
      spin<<<1, 32, 0, main_s>>>(20000, stamps + 2 * k);
      if (f.kind != 0) {
        CK(cudaEventRecord(forks[k], main_s));
        CK(cudaStreamWaitEvent(side, forks[k]));
        launch_fill(f, side);
      }
      collective<<<1, 32, 0, main_s>>>(stamps + 2 * k + 1);
      reader<<<grid, threads, 0, main_s>>>(w, n, 0, out);
    }
    if (f.kind != 0) {
      CK(cudaEventRecord(joined, side));
      CK(cudaStreamWaitEvent(main_s, joined));
    }
    CK(cudaStreamEndCapture(main_s, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    std::vector<float> gaps;
    std::vector<uint64_t> h(2 * windows);
    for (int r = 0; r < replays + 2; ++r) {
      CK(cudaGraphLaunch(ge, main_s));
      CK(cudaStreamSynchronize(main_s));
      CK(cudaMemcpy(h.data(), stamps, h.size() * 8, cudaMemcpyDeviceToHost));
      if (r < 2) continue;
      for (int k = 0; k < windows; ++k) gaps.push_back((int64_t)(h[2 * k + 1] - h[2 * k]) / 1e3f);
    }
    std::sort(gaps.begin(), gaps.end());
    printf("  %-10s %6.3f / %6.3f\n", f.name.c_str(), gaps[gaps.size() / 2],
           gaps[gaps.size() * 9 / 10]);
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
  }
  return 0;
}
