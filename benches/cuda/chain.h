// What the graph-branch probes share (`graph_fork_probe.cu`, `graph_branch_probe.cu`): a chain
// of decode windows' kernels that stamp their first block's start and last block's end on the
// device clock, and the plan's load-based L2 prefetch.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

__device__ inline uint64_t now() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// st[0]: the first block's start (atomicMin), st[1]: the last block's end (atomicMax); st may be
// null (nothing stamped).
__device__ inline void stamp_start(unsigned long long* st) {
  if (st && threadIdx.x == 0) atomicMin(&st[0], (unsigned long long)now());
}

__device__ inline void stamp_end(unsigned long long* st) {
  __syncthreads();
  if (st && threadIdx.x == 0) atomicMax(&st[1], (unsigned long long)now());
}

// The layer's compute (on every SM) or a collective (on a few): polls the clock for ns.
__global__ void spin(uint64_t ns, unsigned long long* st) {
  stamp_start(st);
  uint64_t t0 = now();
  while (now() - t0 < ns) {
  }
  stamp_end(st);
}

// A weight-bound reader: XORs n uint4 into one word per block.
__global__ void reader(const uint4* __restrict__ w, uint64_t n, uint32_t* out,
                       unsigned long long* st) {
  stamp_start(st);
  uint32_t acc = 0;
  for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n;
       i += (uint64_t)gridDim.x * blockDim.x) {
    uint4 v = w[i];
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x12345678u) out[blockIdx.x] = acc;
  stamp_end(st);
}

// As l2_prefetch_loads: every 16-byte word loaded with ld.global.nc, the values dropped.
__global__ void prefetch_loads(const uint4* __restrict__ w, uint64_t n, unsigned long long* st) {
  stamp_start(st);
  uint32_t acc = 0;
  for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n;
       i += (uint64_t)gridDim.x * blockDim.x) {
    uint4 v;
    asm volatile("ld.global.nc.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(w + i));
    acc ^= v.x;
  }
  asm volatile("" ::"r"(acc));
  stamp_end(st);
}
