// A CUDA C++ probe, not part of the build: what the instructions before a decode-size gather's
// first load cost a launch replayed from a graph (issue 24 item 4: `gather_words8_pass` trails
// the Triton peer by 0.07-0.1 us a call with its parameters on one constant-bank line). The same
// gather, a thread per 8 bytes of 256-byte rows, one pass, 32-bit indices, the id checked and the
// loads and store predicated, written five ways:
//   const      the words a row a compile-time constant (as Triton's ROW_BYTES), plain loads
//   nc         the same with read-only (`ld.global.nc`) loads, as fetchahead's
//   div        the words a row from the parameters, a u32 division and remainder
//   pow2       the same, split by a shift when the width is a power of two, as fetchahead's
//   const/blk  as const, the block size a compile-time constant too (no blockDim read)
// Each case is a graph of 100 launches in a chain, replayed 200 times, timed with events; cases
// interleaved over 7 rounds, the median per call printed.
// On the GPU machine:
//   nvcc -O3 -arch=sm_90 -std=c++17 benches/cuda/prologue_probe.cu -o /tmp/pp && /tmp/pp
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "probe.h"

// 48 bytes: everything inside the first constant-bank line.
struct Params {
  const uint64_t* table;
  const int64_t* ids;
  uint64_t* out;
  uint64_t n;
  uint64_t rows;
  uint32_t words;  // 8-byte words a row
  uint32_t pad;
};

enum Split { CONST, DIV, POW2 };

template <Split SPLIT, bool NC, int BLOCK>
__global__ void gather_words(Params p) {
  uint32_t block = BLOCK ? BLOCK : blockDim.x;
  uint32_t t = blockIdx.x * block + threadIdx.x;
  uint32_t i, w;
  if (SPLIT == CONST) {
    i = t / 32;
    w = t % 32;
  } else if (SPLIT == DIV) {
    i = t / p.words;
    w = t % p.words;
  } else {
    if ((p.words & (p.words - 1)) == 0) {
      uint32_t shift = __popc(p.words - 1);
      i = t >> shift;
      w = t & (p.words - 1);
    } else {
      i = t / p.words;
      w = t % p.words;
    }
  }
  uint32_t words = SPLIT == CONST ? 32 : p.words;
  bool live = i < p.n;
  int64_t id = live ? p.ids[i] : -1;
  bool found = id >= 0 && (uint64_t)id < p.rows;
  uint64_t v = 0;
  if (found) {
    const uint64_t* src = p.table + (uint64_t)id * words + w;
    v = NC ? __ldg(src) : *src;
  }
  if (live) p.out[(uint64_t)i * words + w] = v;
}

int main() {
  const uint64_t rows = 1 << 24;  // 4 GiB of 256-byte rows
  uint64_t* table;
  uint64_t* out;
  CK(cudaMalloc(&table, rows * 256));
  CK(cudaMemset(table, 1, rows * 256));
  CK(cudaMalloc(&out, 4096 * 256));
  int64_t* ids = device_ids(rows, 88172645463325252ull);
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const char* names[] = {"const", "nc", "div", "pow2", "const/blk"};
  for (uint64_t n : {72ull, 4096ull}) {
    Params p{table, ids, out, n, rows, 32, 0};
    unsigned blocks = (unsigned)((n * 32 + 127) / 128);
    auto time = [&](auto kernel) {
      return time_graph([&](cudaStream_t st) { kernel<<<blocks, 128, 0, st>>>(p); }, s);
    };
    std::vector<std::vector<float>> got(5);
    for (int round = 0; round < 7; round++) {
      got[0].push_back(time(gather_words<CONST, false, 0>));
      got[1].push_back(time(gather_words<CONST, true, 0>));
      got[2].push_back(time(gather_words<DIV, false, 0>));
      got[3].push_back(time(gather_words<POW2, false, 0>));
      got[4].push_back(time(gather_words<CONST, false, 128>));
    }
    for (int c = 0; c < 5; c++) {
      auto v = got[c];
      std::sort(v.begin(), v.end());
      printf("words8 n=%-5llu blocks=%-4u %-10s: %.3f us a call (min %.3f, max %.3f)\n",
             (unsigned long long)n, blocks, names[c], v[3], v[0], v[6]);
    }
  }
  return 0;
}
