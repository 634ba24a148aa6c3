// A CUDA C++ probe, not part of the build: does an L2-prefetch side branch run beside the
// collective it was forked before, eagerly and replayed from a CUDA graph, as the L2 plan's
// replay does? Per window: a simulated collective (4 blocks spinning 25 us) then a weight-bound
// reader of 28 MiB of its own weights on the main stream; on a side stream forked before the
// collective, the first 6 MiB of those weights asked of L2 by 8 blocks of prefetch instructions
// (the plan's default budget on the H200, a tenth of L2). The side stream is joined once, at the end. Every kernel stamps its
// start and end (%globaltimer); the probe prints where the prefetch ran against the collective
// and the reader's time, without the prefetch and with it.
// On the GPU machine:
//   nvcc -O3 -arch=sm_90 -std=c++17 benches/cuda/graph_overlap_probe.cu -o /tmp/go && /tmp/go
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#define CK(x)                                                      \
  do {                                                             \
    cudaError_t e = (x);                                           \
    if (e) {                                                       \
      printf("err %s line %d\n", cudaGetErrorString(e), __LINE__); \
      exit(1);                                                     \
    }                                                              \
  } while (0)

__device__ uint64_t now() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// st[0]: start (block 0), st[1]: end (the last block, by atomicMax).
__device__ void stamp_end(uint64_t* st) {
  __syncthreads();
  if (threadIdx.x == 0) atomicMax((unsigned long long*)&st[1], (unsigned long long)now());
}

__global__ void spin(uint64_t ns, uint64_t* st) {
  uint64_t t0 = now();
  if (blockIdx.x == 0 && threadIdx.x == 0) st[0] = t0;
  while (now() - t0 < ns) {
  }
  stamp_end(st);
}

// Reads n uint4; with `all` every thread's sum is stored, so that no load is dropped.
__global__ void load(const uint4* __restrict__ w, uint64_t n, uint32_t* out, uint64_t* st) {
  if (blockIdx.x == 0 && threadIdx.x == 0) st[0] = now();
  uint32_t acc = 0;
  for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n; i += (uint64_t)gridDim.x * blockDim.x) {
    uint4 v = w[i];
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x12345678u) out[blockIdx.x] = acc;
  stamp_end(st);
}

// Asks L2 for n bytes from w, a 128-byte line a prefetch instruction.
__global__ void prefetch_l2(const char* w, uint64_t n, uint64_t* st) {
  if (blockIdx.x == 0 && threadIdx.x == 0) st[0] = now();
  for (uint64_t i = (blockIdx.x * (uint64_t)blockDim.x + threadIdx.x) * 128; i < n; i += (uint64_t)gridDim.x * blockDim.x * 128)
    asm volatile("prefetch.global.L2 [%0];" ::"l"(w + i));
  stamp_end(st);
}

const int WINDOWS = 40;
const uint64_t BYTES = 28ull << 20, WARM = 6ull << 20;

int main() {
  cudaDeviceProp p;
  CK(cudaGetDeviceProperties(&p, 0));
  int sms = p.multiProcessorCount;
  cudaStream_t main_s, side;
  CK(cudaStreamCreateWithFlags(&main_s, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  std::vector<uint4*> w(WINDOWS);
  for (auto& x : w) {
    CK(cudaMalloc(&x, BYTES));
    CK(cudaMemset(x, 1, BYTES));
  }
  uint32_t* sink;
  CK(cudaMalloc(&sink, 4 * 8192));
  uint64_t* st;  // per window: collective, reader, prefetch
  CK(cudaMalloc(&st, 8 * 6 * WINDOWS));
  std::vector<cudaEvent_t> fork(WINDOWS);
  cudaEvent_t join;
  CK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
  for (auto& ev : fork) CK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  auto enqueue = [&](bool prefetch) {
    CK(cudaMemsetAsync(st, 0, 8 * 6 * WINDOWS, main_s));
    for (int k = 0; k < WINDOWS; k++) {
      uint64_t* s = st + 6 * k;
      if (prefetch) {
        CK(cudaEventRecord(fork[k], main_s));
        CK(cudaStreamWaitEvent(side, fork[k], 0));
        prefetch_l2<<<8, 256, 0, side>>>((const char*)w[k], WARM, s + 4);
      }
      spin<<<4, 128, 0, main_s>>>(25000, s);
      load<<<sms * 4, 256, 0, main_s>>>(w[k], BYTES / 16, sink, s + 2);
    }
    if (prefetch) {
      CK(cudaEventRecord(join, side));
      CK(cudaStreamWaitEvent(main_s, join, 0));
    }
  };
  for (int prefetch = 0; prefetch < 2; prefetch++) {
    cudaGraph_t g;
    cudaGraphExec_t exec;
    CK(cudaStreamBeginCapture(main_s, cudaStreamCaptureModeThreadLocal));
    enqueue(prefetch);
    CK(cudaStreamEndCapture(main_s, &g));
    CK(cudaGraphInstantiate(&exec, g, 0));
    for (int graph = 0; graph < 2; graph++) {
      std::vector<double> lead, tail, rd, gap;
      for (int rep = 0; rep < 12; rep++) {
        if (graph)
          CK(cudaGraphLaunch(exec, main_s));
        else
          enqueue(prefetch);
        CK(cudaStreamSynchronize(main_s));
        std::vector<uint64_t> h(6 * WINDOWS);
        CK(cudaMemcpy(h.data(), st, 8 * 6 * WINDOWS, cudaMemcpyDeviceToHost));
        if (rep < 2) continue;
        for (int k = 1; k < WINDOWS; k++) {
          uint64_t* s = &h[6 * k];
          rd.push_back((s[3] - s[2]) / 1e3);
          gap.push_back(((double)s[2] - (double)s[1]) / 1e3);
          if (prefetch) {
            lead.push_back(((double)s[4] - (double)s[0]) / 1e3);
            tail.push_back(((double)s[5] - (double)s[1]) / 1e3);
          }
        }
      }
      auto med = [](std::vector<double> v) {
        if (v.empty()) return 0.0;
        std::sort(v.begin(), v.end());
        return v[v.size() / 2];
      };
      printf("%-12s %-5s reader %6.2f us (starts %5.2f us after the collective ends)", prefetch ? "prefetch" : "no prefetch",
             graph ? "graph" : "eager", med(rd), med(gap));
      if (prefetch)
        printf("; prefetch starts %+7.2f us after the collective starts, ends %+7.2f us after it ends", med(lead),
               med(tail));
      printf("\n");
    }
  }
  return 0;
}
