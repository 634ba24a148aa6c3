// A CUDA C++ probe, not part of the build: the gather + MXFP8 dequant at 1M and 4M random rows of
// a 4 GiB table, written in the Triton peer's shape (issue 24 item 2). The peer at 4M runs ROWS =
// 4 on 2 warps: a block of 64 threads per 4 rows, one pass, each thread one 16-byte weight load
// of 16 elements, its scale byte, and 32 bytes of bf16 out. Variants of that shape:
//   c16          a thread per 16 elements, blocks of B threads (B / 16 rows), one pass
//   c16 cvt      the same with the hardware conversion (cvt e4m3x2 -> f16x2, f32 multiply)
//   c16 cs       streaming stores
//   c16 smem     the 32 bytes a thread makes staged through shared memory so that each warp
//                store writes 512 contiguous bytes
//   c16 x2       two rows a thread (rows r and r + B / 16), both loaded before either is stored
//   c16 loop     a grid-stride loop over the same work, 8 blocks an SM (the crate's chunk16)
//   units x2     the crate's default above 256K rows (`_u8_packed_x2_b64` as written here)
//   ceiling      c16 with no arithmetic: each 2-byte output the weight byte and its scale byte
// against cudaMemcpy of the table bytes of the same n ("x copy" counts ids, weights, scales read
// and bf16 written against the copy's read + write). Given fetchahead's PTX and entry names, it
// also times those entries, launched through the driver with fetchahead's DequantParams (timeline
// off) on the grid its host would size (threads = n x dim / 8 / unroll, or n x dim / 16 for
// `chunk16` and `chunk_pass`; `--grid` per entry below), in the same process.
// On the GPU machine:
//   nvcc -O3 -arch=sm_90 -std=c++17 benches/cuda/dequant_shape_probe.cu -lcuda -o /tmp/ds
//   /tmp/ds [fetchahead_gpu.ptx ENTRY:ELEMS_A_THREAD:BLOCK[:loop] ...]
//   e.g. /tmp/ds fa.ptx gather_dequant_chunk_pass_b64:16:64 gather_dequant_u8_packed_x2_b64:16:64:loop
#include "probe.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

__device__ __forceinline__ uint32_t place(uint32_t lanes) {
  return (lanes & 0x80008000u) | ((lanes & 0x7F007F00u) >> 4);
}
__device__ __forceinline__ uint32_t mulbf(uint32_t a, uint32_t b) {
  __nv_bfloat162 x = *reinterpret_cast<__nv_bfloat162*>(&a), y = *reinterpret_cast<__nv_bfloat162*>(&b);
  __nv_bfloat162 r = __hmul2(x, y);
  return *reinterpret_cast<uint32_t*>(&r);
}
// The crate's packed conversion of 4 E4M3 bytes (one word) at scale s: two bf16x2 words.
__device__ __forceinline__ uint2 packed4(uint32_t in, uint8_t s) {
  uint32_t one = s == 0 ? 0x40u : (uint32_t)s << 7, sc = one | one << 16;
  uint32_t lo = place(__byte_perm(in, 0, 0x1404)), hi = place(__byte_perm(in, 0, 0x3424));
  uint32_t nan = (((in & 0x7F7F7F7Fu) + 0x01010101u) & 0x80808080u) | (s == 0xFF ? 0x80808080u : 0);
  uint32_t ml = __byte_perm(nan, 0, 0x9988), mh = __byte_perm(nan, 0, 0xBBAA);
  return make_uint2((mulbf(mulbf(lo, 0x7B807B80u), sc) & ~ml) | (0x7FFF7FFFu & ml),
                    (mulbf(mulbf(hi, 0x7B807B80u), sc) & ~mh) | (0x7FFF7FFFu & mh));
}
// The hardware path on 4 bytes: e4m3x2 -> f16x2 -> f32, times the scale, -> bf16x2.
__device__ __forceinline__ uint2 cvt4(uint32_t in, uint8_t s) {
  float scale = __uint_as_float((uint32_t)s << 23);
  uint32_t o[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    __half2_raw r = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(in >> (16 * h)), __NV_E4M3);
    __half2 v = *reinterpret_cast<__half2*>(&r);
    float2 f = __half22float2(v);
    __nv_bfloat162 b = __floats2bfloat162_rn(f.x * scale, f.y * scale);
    o[h] = *reinterpret_cast<uint32_t*>(&b);
  }
  return make_uint2(o[0], o[1]);
}
// No arithmetic: each output element the weight byte (low) and the scale byte (high).
__device__ __forceinline__ uint2 raw4(uint32_t in, uint8_t s) {
  uint32_t sh = (uint32_t)s << 8 | (uint32_t)s << 24;
  return make_uint2(__byte_perm(in, 0, 0x4140) | sh, __byte_perm(in, 0, 0x4342) | sh);
}

enum Conv { PACKED, CVT, RAW };
template <int C>
__device__ __forceinline__ uint2 conv4(uint32_t in, uint8_t s) {
  if (C == PACKED) return packed4(in, s);
  if (C == CVT) return cvt4(in, s);
  return raw4(in, s);
}

// One 16-element chunk: 32 bytes of output words.
template <int C>
__device__ __forceinline__ void convert16(uint4 w, uint8_t s, uint4& a, uint4& b) {
  uint2 p = conv4<C>(w.x, s), q = conv4<C>(w.y, s), r = conv4<C>(w.z, s), t = conv4<C>(w.w, s);
  a = make_uint4(p.x, p.y, q.x, q.y);
  b = make_uint4(r.x, r.y, t.x, t.y);
}

// STORE: 0 plain, 1 streaming, 2 through shared memory (512 contiguous bytes a warp store).
template <int C, int B, int ROWS_A_THREAD, int STORE>
__global__ void __launch_bounds__(B) c16(const uint8_t* __restrict__ w, const uint8_t* __restrict__ sc,
                                         const int64_t* __restrict__ ids, uint4* __restrict__ out,
                                         uint64_t n) {
  constexpr int ROWS = B / 16;
  uint32_t t = threadIdx.x, c = t % 16;
  uint64_t first = (uint64_t)blockIdx.x * ROWS * ROWS_A_THREAD + t / 16;
  int64_t id[ROWS_A_THREAD];
  uint4 v[ROWS_A_THREAD];
  uint8_t s[ROWS_A_THREAD];
#pragma unroll
  for (int j = 0; j < ROWS_A_THREAD; ++j) {
    uint64_t i = first + j * ROWS;
    id[j] = i < n ? ids[i] : 0;
  }
#pragma unroll
  for (int j = 0; j < ROWS_A_THREAD; ++j) {
    uint64_t i = first + j * ROWS;
    v[j] = make_uint4(0, 0, 0, 0);
    s[j] = 127;
    if (i < n) {
      v[j] = *reinterpret_cast<const uint4*>(w + id[j] * 256 + 16 * c);
      s[j] = sc[id[j] * 8 + c / 2];
    }
  }
  __shared__ uint4 stage[STORE == 2 ? 2 * B : 1];
#pragma unroll
  for (int j = 0; j < ROWS_A_THREAD; ++j) {
    uint64_t i = first + j * ROWS;
    uint4 a, b;
    convert16<C>(v[j], s[j], a, b);
    uint4* row = out + i * 32;
    if (STORE == 2) {
      // The block's ROWS rows are contiguous output: stage them, then store word k of the block
      // from thread k % B.
      stage[2 * t] = a;
      stage[2 * t + 1] = b;
      __syncthreads();
      uint64_t base = ((uint64_t)blockIdx.x * ROWS * ROWS_A_THREAD + j * ROWS) * 32;
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        uint64_t word = base + t + k * B;
        if (word / 32 < n) out[word] = stage[t + k * B];
      }
      __syncthreads();
    } else if (i < n) {
      if (STORE == 1) {
        __stcs(row + 2 * c, a);
        __stcs(row + 2 * c + 1, b);
      } else {
        row[2 * c] = a;
        row[2 * c + 1] = b;
      }
    }
  }
}

// The same chunks over a grid-stride loop.
template <int C>
__global__ void __launch_bounds__(256) c16_loop(const uint8_t* __restrict__ w, const uint8_t* __restrict__ sc,
                                                const int64_t* __restrict__ ids, uint4* __restrict__ out,
                                                uint64_t n) {
  uint64_t total = n * 16, stride = gridDim.x * (uint64_t)blockDim.x;
  for (uint64_t q = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; q < total; q += stride) {
    int64_t id = ids[q / 16];
    uint4 v = *reinterpret_cast<const uint4*>(w + id * 256 + 16 * (q % 16));
    uint8_t s = sc[id * 8 + (q % 16) / 2];
    uint4 a, b;
    convert16<C>(v, s, a, b);
    out[2 * q] = a;
    out[2 * q + 1] = b;
  }
}

// The crate's units layout, 2 units a lane, one pass, blocks of 64 (`_u8_packed_x2_pass_b64`).
__global__ void __launch_bounds__(64) units_x2(const uint8_t* __restrict__ w, const uint8_t* __restrict__ sc,
                                               const int64_t* __restrict__ ids, uint4* __restrict__ out,
                                               uint64_t n) {
  uint64_t total = n * 32, lane = threadIdx.x % 32;
  uint64_t tile = (blockIdx.x * (uint64_t)blockDim.x + threadIdx.x) / 32;
  uint64_t base = tile * 64 + lane;
  int64_t id[2];
  uint2 v[2];
  uint8_t s[2];
#pragma unroll
  for (int j = 0; j < 2; j++) {
    uint64_t u = base + 32 * j;
    id[j] = u < total ? ids[u >> 5] : 0;
  }
#pragma unroll
  for (int j = 0; j < 2; j++) {
    uint64_t u = base + 32 * j, c = u & 31;
    v[j] = make_uint2(0, 0);
    s[j] = 127;
    if (u < total) {
      v[j] = *reinterpret_cast<const uint2*>(w + id[j] * 256 + 8 * c);
      s[j] = sc[id[j] * 8 + c / 4];
    }
  }
#pragma unroll
  for (int j = 0; j < 2; j++) {
    uint64_t u = base + 32 * j;
    if (u < total) {
      uint2 p = packed4(v[j].x, s[j]), q = packed4(v[j].y, s[j]);
      out[u] = make_uint4(p.x, p.y, q.x, q.y);
    }
  }
}

// A fetchahead entry as the command line names it: NAME:ELEMS_A_THREAD:BLOCK[:loop].
struct FaEntry {
  std::string name;
  CUfunction f;
  int elems, block;
  bool loop;
};

int main(int argc, char** argv) {
  CK(cudaFree(0));
  std::vector<FaEntry> entries;
  if (argc > 2) {
    std::string text = read_file(argv[1]);
    CUmodule m;
    CU(cuModuleLoadData(&m, text.c_str()));
    for (int k = 2; k < argc; ++k) {
      std::string a = argv[k];
      FaEntry entry;
      size_t p1 = a.find(':'), p2 = a.find(':', p1 + 1), p3 = a.find(':', p2 + 1);
      entry.name = a.substr(0, p1);
      entry.elems = atoi(a.substr(p1 + 1, p2 - p1 - 1).c_str());
      entry.block = atoi(a.substr(p2 + 1, p3 == std::string::npos ? std::string::npos : p3 - p2 - 1).c_str());
      entry.loop = p3 != std::string::npos;
      CU(cuModuleGetFunction(&entry.f, m, entry.name.c_str()));
      entries.push_back(entry);
    }
  }
  uint64_t* status;
  CK(cudaMalloc(&status, 64));
  CK(cudaMemset(status, 0, 64));
  const uint64_t rows = (4ull << 30) / 256, max_n = 4ull << 20;
  uint8_t *w, *sc, *cs, *cd;
  int64_t* ids;
  uint4* out;
  CK(cudaMalloc(&w, rows * 256));
  CK(cudaMalloc(&sc, rows * 8));
  CK(cudaMalloc(&ids, max_n * 8));
  CK(cudaMalloc(&out, max_n * 512));
  CK(cudaMalloc(&cs, max_n * 256));
  CK(cudaMalloc(&cd, max_n * 256));
  // Random bytes: every code, NaNs included (the packed path costs the same on any data).
  {
    std::mt19937_64 rng(3);
    std::vector<uint64_t> chunk(1 << 20);
    for (uint64_t at = 0; at < rows * 256; at += chunk.size() * 8) {
      for (auto& x : chunk) x = rng();
      CK(cudaMemcpy(w + at, chunk.data(), chunk.size() * 8, cudaMemcpyHostToDevice));
    }
    for (uint64_t at = 0; at < rows * 8; at += chunk.size() * 8) {
      for (auto& x : chunk) x = rng();
      CK(cudaMemcpy(sc + at, chunk.data(), std::min<uint64_t>(chunk.size() * 8, rows * 8 - at),
                    cudaMemcpyHostToDevice));
    }
  }
  std::mt19937_64 rng(7);
  std::vector<int64_t> h(max_n);
  for (auto& x : h) x = rng() % rows;
  CK(cudaMemcpy(ids, h.data(), max_n * 8, cudaMemcpyHostToDevice));
  int sms;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  auto time = [&](auto f) {
    f();
    CK(cudaDeviceSynchronize());
    CK(cudaGetLastError());
    std::vector<float> t;
    for (int r = 0; r < 9; r++) {
      CK(cudaEventRecord(a));
      for (int i = 0; i < 10; i++) f();
      CK(cudaEventRecord(b));
      CK(cudaEventSynchronize(b));
      float ms;
      CK(cudaEventElapsedTime(&ms, a, b));
      t.push_back(ms * 100);
    }
    std::sort(t.begin(), t.end());
    return t[4];
  };
  for (uint64_t n : {max_n / 4, max_n}) {
    float copy = time([&] { cudaMemcpyAsync(cd, cs, n * 256, cudaMemcpyDeviceToDevice); });
    double rate = 2.0 * n * 256 / copy, bytes = n * (256 + 8 + 512 + 8.0);
    printf("n = %llu: copy of %llu MiB %.1f us (%.1f GB/s read + write)\n", (unsigned long long)n,
           (unsigned long long)(n * 256 >> 20), copy, rate / 1e3);
    auto report = [&](const char* name, float us) {
      printf("  %-30s %8.1f us  %.3f x copy\n", name, us, bytes / us / rate);
    };
    auto grid = [&](int b, int rows_a_thread) {
      uint64_t per = (uint64_t)(b / 16) * rows_a_thread;
      return (unsigned)((n + per - 1) / per);
    };
#define C16(C, B, R, S, name) \
  report(name, time([&] { c16<C, B, R, S><<<grid(B, R), B>>>(w, sc, ids, out, n); }))
    C16(PACKED, 64, 1, 0, "c16 b64");
    C16(PACKED, 128, 1, 0, "c16 b128");
    C16(PACKED, 256, 1, 0, "c16 b256");
    C16(CVT, 64, 1, 0, "c16 cvt b64");
    C16(CVT, 128, 1, 0, "c16 cvt b128");
    C16(PACKED, 64, 1, 1, "c16 cs b64");
    C16(PACKED, 64, 1, 2, "c16 smem b64");
    C16(PACKED, 128, 1, 2, "c16 smem b128");
    C16(CVT, 64, 1, 2, "c16 cvt smem b64");
    C16(PACKED, 64, 2, 0, "c16 x2 b64");
    C16(PACKED, 128, 2, 0, "c16 x2 b128");
    C16(PACKED, 64, 2, 2, "c16 x2 smem b64");
    C16(RAW, 64, 1, 0, "ceiling c16 b64");
    C16(RAW, 128, 1, 0, "ceiling c16 b128");
    C16(RAW, 64, 1, 2, "ceiling c16 smem b64");
    C16(RAW, 64, 1, 1, "ceiling c16 cs b64");
    report("c16 loop (8 blocks an SM)",
           time([&] { c16_loop<PACKED><<<sms * 8, 256>>>(w, sc, ids, out, n); }));
    report("units x2 pass b64", time([&] {
             units_x2<<<(unsigned)((n * 32 / 64 * 32 + 63) / 64), 64>>>(w, sc, ids, out, n);
           }));
    for (auto& entry : entries) {
      FaDequantParams p = {(uint64_t)w,   (uint64_t)sc,     (uint64_t)ids, (uint64_t)out,
                           rows,          (uint32_t)n, 256, (uint64_t)status, 0,
                           0,             0xFFFFFFFFu};
      uint64_t threads = (n * 256 / entry.elems + 31) / 32 * 32;
      unsigned blocks = (unsigned)((threads + entry.block - 1) / entry.block);
      if (entry.loop) {
        int per_sm;
        CU(cuOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, entry.f, entry.block, 0));
        blocks = std::min<unsigned>(blocks, (unsigned)(per_sm * sms));
      }
      void* args[] = {&p};
      report(("fa " + entry.name).c_str(), time([&] {
               CU(cuLaunchKernel(entry.f, blocks, 1, 1, entry.block, 1, 1, 0, 0, args, nullptr));
             }));
    }
  }
  return 0;
}
