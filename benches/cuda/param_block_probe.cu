// A CUDA C++ probe, not part of the build: what the size of a kernel's parameter block costs a
// launch replayed from a CUDA graph, at decode sizes. The same row gather (a thread per 16-byte
// chunk, 256 threads a block, ids as int64, rows of 256 bytes) is compiled with its parameters
// padded to 40, 48, 56, 64, 72, 80, 96 and 128 bytes (the padding never read), and an empty
// kernel the same ways. Part 2 keeps the 40 bytes the gather reads but moves them: PRE bytes of
// padding before them (0 to 112, so that they start later in the constant bank and, past 8 or
// more, straddle a 64-byte line of it), and one field a 64-byte line ("spread"). Each case is a
// graph of 100 launches in a chain, replayed 200 times and timed with events; cases interleaved
// over rounds, the median per call printed.
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

template <typename P>
__global__ void gather(P p) {
  gather_chunks(p);
}

template <int PAD>
__global__ void empty(Params<PAD> p) {}

// The 40 bytes a gather reads after PRE bytes it never reads.
template <int PRE>
struct Late {
  char pre[PRE];
  const uint4* table;
  const int64_t* ids;
  uint4* out;
  uint64_t n;
  uint64_t rows;
};

// Each field alone on a 64-byte line of the parameter block.
struct Spread {
  const uint4* table;
  char p0[56];
  const int64_t* ids;
  char p1[56];
  uint4* out;
  char p2[56];
  uint64_t n;
  char p3[56];
  uint64_t rows;
};

// base's fields in a struct of type P, its padding zero.
template <typename P>
P placed(const Params<0>& base) {
  P p;
  memset(&p, 0, sizeof(p));
  p.table = base.table;
  p.ids = base.ids;
  p.out = base.out;
  p.n = base.n;
  p.rows = base.rows;
  return p;
}

template <typename P>
float time_late(Params<0> base, cudaStream_t s, int blocks) {
  P p = placed<P>(base);
  return time_graph([&](cudaStream_t st) { gather<P><<<blocks, 256, 0, st>>>(p); }, s);
}

template <int PAD>
float time_case(bool body, Params<0> base, cudaStream_t s, int blocks) {
  Params<PAD> p = placed<Params<PAD>>(base);
  return time_graph(
      [&](cudaStream_t st) {
        if (body)
          gather<Params<PAD>><<<blocks, 256, 0, st>>>(p);
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
  const char* late_names[] = {"pre 0", "pre 8", "pre 16", "pre 24", "pre 32",
                              "pre 48", "pre 64", "pre 112", "spread"};
  for (int n : {72, 4096}) {
    Params<0> base{table, ids, out, (uint64_t)n, rows};
    int blocks = (n * 16 + 255) / 256;
    std::vector<std::vector<float>> got(9);
    for (int round = 0; round < 7; round++) {
      got[0].push_back(time_case<0>(true, base, s, blocks));
      got[1].push_back(time_late<Late<8>>(base, s, blocks));
      got[2].push_back(time_late<Late<16>>(base, s, blocks));
      got[3].push_back(time_late<Late<24>>(base, s, blocks));
      got[4].push_back(time_late<Late<32>>(base, s, blocks));
      got[5].push_back(time_late<Late<48>>(base, s, blocks));
      got[6].push_back(time_late<Late<64>>(base, s, blocks));
      got[7].push_back(time_late<Late<112>>(base, s, blocks));
      got[8].push_back(time_late<Spread>(base, s, blocks));
    }
    for (int i = 0; i < 9; i++) {
      auto v = got[i];
      std::sort(v.begin(), v.end());
      printf("gather n=%-5d blocks=%-3d fields at %-8s: %.3f us a call (min %.3f, max %.3f)\n",
             n, blocks, late_names[i], v[3], v[0], v[6]);
    }
  }
  return 0;
}
