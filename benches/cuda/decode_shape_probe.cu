// A CUDA C++ probe, not part of the build: which launch shape a decode-size call (72 and 4096
// rows of 256 bytes) costs least when replayed from a graph (issue 24 item 4). The row width and
// the block size are compile-time constants in every case (as in fetchahead's width builds); what
// varies is how many bytes a thread moves and how many threads a block has:
//   gather  B bytes a thread (8: one 8-byte load; 16: one 16-byte load; 32: two 16-byte loads),
//           blocks of 32 / 64 / 128 / 256 threads
//   dequant E elements a thread (4: a 4-byte weight load, one 8-byte store, the Triton peer's
//           tile at 72 rows; 8: an 8-byte weight load, one 16-byte store; 16: a 16-byte load,
//           two stores; 32: two loads, four stores) and the thread's scale byte, each E4M3 byte
//           widened to f32, scaled by the exponent bits (s << 23), stored as bf16 (the Triton
//           peer's arithmetic), blocks of 64 / 128 / 256
// The id is checked and every load and store predicated, as in fetchahead's one-pass bodies.
// Each case is a graph of 100 chained launches replayed 200 times; cases interleaved over 7
// rounds, the median per call printed with the rounds' min and max.
// On the GPU machine:
//   nvcc -O3 -arch=sm_90 -std=c++17 benches/cuda/decode_shape_probe.cu -o /tmp/dsp && /tmp/dsp
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "probe.h"

struct Params {
  const uint8_t* table;
  const uint8_t* scales;
  const int64_t* ids;
  uint8_t* out;
  uint32_t n;
  uint32_t pad;
  uint64_t rows;
};

constexpr uint32_t ROW = 256;

// A thread's place: its output row i and part c of it (PER_ROW parts a row), whether the row
// exists (live) and its id lies in the table (found).
struct Place {
  uint32_t i, c;
  bool live, found;
  int64_t id;
};

template <uint32_t PER_ROW, int BLOCK>
__device__ __forceinline__ Place place(const Params& p) {
  uint32_t t = blockIdx.x * BLOCK + threadIdx.x;
  Place q{t / PER_ROW, t % PER_ROW, false, false, -1};
  q.live = q.i < p.n;
  q.id = q.live ? p.ids[q.i] : -1;
  q.found = q.id >= 0 && (uint64_t)q.id < p.rows;
  return q;
}

template <int BYTES, int BLOCK>
__global__ void __launch_bounds__(BLOCK) gather(Params p) {
  auto [i, c, live, found, id] = place<ROW / BYTES, BLOCK>(p);
  const uint8_t* src = p.table + (uint64_t)id * ROW + c * BYTES;
  uint8_t* dst = p.out + (uint64_t)i * ROW + c * BYTES;
  if constexpr (BYTES == 8) {
    uint64_t v = found ? __ldg((const unsigned long long*)src) : 0;
    if (live) *(uint64_t*)dst = v;
  } else {
    constexpr int K = BYTES / 16;
    uint4 v[K];
#pragma unroll
    for (int k = 0; k < K; k++) v[k] = found ? __ldg((const uint4*)src + k) : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int k = 0; k < K; k++)
      if (live) ((uint4*)dst)[k] = v[k];
  }
}

__device__ __forceinline__ uint32_t widen_pair(uint32_t two, float scale) {
  // Two E4M3 bytes to f32 by shifting sign and bits into place and multiplying by 2^120 (which
  // also normalizes subnormals), times the scale, then to bf16 by rounding.
  float a = __uint_as_float(((two & 0x80) << 24) | ((two & 0x7f) << 20)) * 0x1p120f * scale;
  float b = __uint_as_float(((two & 0x8000) << 16) | ((two & 0x7f00) << 12)) * 0x1p120f * scale;
  __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
  return *(uint32_t*)&h;
}

template <int ELEMS, int BLOCK>
__global__ void __launch_bounds__(BLOCK) dequant(Params p) {
  auto [i, c, live, found, id] = place<ROW / ELEMS, BLOCK>(p);
  const uint8_t* src = p.table + (uint64_t)id * ROW + c * ELEMS;
  // One scale a 32 elements: a thread of 8 or 16 elements has one, of 32 one too.
  uint32_t s = found ? __ldg(p.scales + (uint64_t)id * (ROW / 32) + c * ELEMS / 32) : 127;
  float scale = __uint_as_float(s << 23);
  constexpr int WORDS = ELEMS / 4;  // 4 weight bytes a word
  uint32_t w[WORDS];
  if constexpr (ELEMS == 4) {
    w[0] = found ? __ldg((const uint32_t*)src) : 0;
  } else if constexpr (ELEMS == 8) {
    uint2 v = found ? __ldg((const uint2*)src) : make_uint2(0, 0);
    w[0] = v.x, w[1] = v.y;
  } else {
#pragma unroll
    for (int k = 0; k < ELEMS / 16; k++) {
      uint4 v = found ? __ldg((const uint4*)src + k) : make_uint4(0, 0, 0, 0);
      w[4 * k] = v.x, w[4 * k + 1] = v.y, w[4 * k + 2] = v.z, w[4 * k + 3] = v.w;
    }
  }
  if constexpr (ELEMS == 4) {
    uint2 o = make_uint2(widen_pair(w[0] & 0xffff, scale), widen_pair(w[0] >> 16, scale));
    if (live) *(uint2*)(p.out + ((uint64_t)i * ROW + c * ELEMS) * 2) = o;
    return;
  }
  uint4* dst = (uint4*)(p.out + ((uint64_t)i * ROW + c * ELEMS) * 2);
#pragma unroll
  for (int k = 0; k < ELEMS / 8; k++) {
    uint4 o;
    o.x = widen_pair(w[2 * k] & 0xffff, scale);
    o.y = widen_pair(w[2 * k] >> 16, scale);
    o.z = widen_pair(w[2 * k + 1] & 0xffff, scale);
    o.w = widen_pair(w[2 * k + 1] >> 16, scale);
    if (live) dst[k] = o;
  }
}

struct Case {
  std::string name;
  void (*kernel)(Params);
  uint32_t per_row;  // threads a row
  uint32_t block;
};

#define GATHER(B, K) Case{"gather " #B "B/thread b" #K, gather<B, K>, ROW / B, K}
#define DEQUANT(E, K) Case{"dequant " #E "el/thread b" #K, dequant<E, K>, ROW / E, K}

int main() {
  DecodeTensors tensors = decode_tensors();  // 4 GiB of 256-byte rows
  const uint64_t rows = tensors.rows;
  uint8_t *table = tensors.table, *scales = tensors.scales, *out = tensors.out;
  int64_t* ids = tensors.ids;
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::vector<Case> cases = {
      GATHER(8, 32),   GATHER(8, 64),   GATHER(8, 128),   GATHER(8, 256),
      GATHER(16, 32),  GATHER(16, 64),  GATHER(16, 128),  GATHER(16, 256),
      GATHER(32, 32),  GATHER(32, 64),  GATHER(32, 128),  GATHER(32, 256),
      DEQUANT(4, 64),  DEQUANT(4, 128), DEQUANT(4, 256),
      DEQUANT(8, 64),  DEQUANT(8, 128), DEQUANT(8, 256),  DEQUANT(16, 64),
      DEQUANT(16, 128), DEQUANT(16, 256), DEQUANT(32, 64), DEQUANT(32, 128),
      DEQUANT(32, 256),
  };
  for (uint32_t n : {72u, 4096u}) {
    Params p{table, scales, ids, out, n, 0, rows};
    std::vector<std::vector<float>> got(cases.size());
    for (int round = 0; round < 7; round++) {
      for (size_t k = 0; k < cases.size(); k++) {
        const Case& c = cases[k];
        unsigned blocks = (n * c.per_row + c.block - 1) / c.block;
        got[k].push_back(time_graph(
            [&](cudaStream_t st) { c.kernel<<<blocks, c.block, 0, st>>>(p); }, s));
      }
    }
    for (size_t k = 0; k < cases.size(); k++) {
      auto v = got[k];
      std::sort(v.begin(), v.end());
      unsigned blocks = (n * cases[k].per_row + cases[k].block - 1) / cases[k].block;
      printf("shape n=%-5u %-26s blocks=%-5u: %.3f us a call (min %.3f, max %.3f)\n", n,
             cases[k].name.c_str(), blocks, v[3], v[0], v[6]);
    }
  }
  CK(cudaGetLastError());
  return 0;
}
