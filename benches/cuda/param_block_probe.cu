// A CUDA C++ probe, not part of the build: what the size of a kernel's parameter block costs a
// launch replayed from a CUDA graph, at decode sizes. The same row gather (a thread per 16-byte
// chunk, 256 threads a block, ids as int64, rows of 256 bytes) is compiled with its parameters
// padded to 40, 48, 56, 64, 72, 80, 96 and 128 bytes (the padding never read), and an empty
// kernel the same ways. Each case is a graph of 100 launches in a chain, replayed 200 times and
// timed with events; cases interleaved over rounds, the median per call printed.
// On the GPU machine:
//   nvcc -O3 -arch=sm_90 -std=c++17 benches/cuda/param_block_probe.cu -o /tmp/pb && /tmp/pb
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "probe.h"

// 40 bytes of what a gather reads, then PAD bytes it never reads.
template <int PAD>
struct Params {
  const uint4* table;
  const int64_t* ids;
  uint4* out;
  uint64_t n;
  uint64_t rows;
  char pad[PAD];
};

template <>
struct Params<0> {
  const uint4* table;
  const int64_t* ids;
  uint4* out;
  uint64_t n;
  uint64_t rows;
};

template <int PAD>
__global__ void gather(Params<PAD> p) {
  uint64_t t = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x;
  uint64_t total = p.n * 16;
  for (; t < total; t += (uint64_t)gridDim.x * blockDim.x) {
    uint64_t i = t >> 4, c = t & 15;
    int64_t id = p.ids[i];
    if (id >= 0 && (uint64_t)id < p.rows) p.out[t] = p.table[id * 16 + c];
  }
}

template <int PAD>
__global__ void empty(Params<PAD> p) {}

template <int PAD>
float time_case(bool body, Params<0> base, cudaStream_t s, int blocks) {
  Params<PAD> p;
  memset(&p, 0, sizeof(p));
  p.table = base.table;
  p.ids = base.ids;
  p.out = base.out;
  p.n = base.n;
  p.rows = base.rows;
  return time_graph(
      [&](cudaStream_t st) {
        if (body)
          gather<PAD><<<blocks, 256, 0, st>>>(p);
        else
          empty<PAD><<<blocks, 256, 0, st>>>(p);
      },
      s);
}

int main() {
  const uint64_t rows = 1 << 20;
  uint4* table;
  int64_t* ids;
  uint4* out;
  CK(cudaMalloc(&table, rows * 256));
  CK(cudaMalloc(&ids, 4096 * 8));
  CK(cudaMalloc(&out, 4096 * 256));
  std::vector<int64_t> h(4096);
  srand(1);
  for (auto& v : h) v = ((uint64_t)rand() * 2654435761u) % rows;
  CK(cudaMemcpy(ids, h.data(), 4096 * 8, cudaMemcpyHostToDevice));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const int pads[] = {0, 8, 16, 24, 32, 40, 56, 88};
  for (int n : {72, 4096}) {
    Params<0> base{table, ids, out, (uint64_t)n, rows};
    int blocks = (n * 16 + 255) / 256;
    for (int body = 0; body < 2; body++) {
      std::vector<std::vector<float>> got(8);
      for (int round = 0; round < 7; round++) {
        got[0].push_back(time_case<0>(body, base, s, blocks));
        got[1].push_back(time_case<8>(body, base, s, blocks));
        got[2].push_back(time_case<16>(body, base, s, blocks));
        got[3].push_back(time_case<24>(body, base, s, blocks));
        got[4].push_back(time_case<32>(body, base, s, blocks));
        got[5].push_back(time_case<40>(body, base, s, blocks));
        got[6].push_back(time_case<56>(body, base, s, blocks));
        got[7].push_back(time_case<88>(body, base, s, blocks));
      }
      for (int i = 0; i < 8; i++) {
        auto v = got[i];
        std::sort(v.begin(), v.end());
        printf("%-6s n=%-5d blocks=%-3d params %3d B: %.3f us a call (min %.3f, max %.3f)\n",
               body ? "gather" : "empty", n, blocks, 40 + pads[i], v[3], v[0], v[6]);
      }
    }
  }
  return 0;
}
