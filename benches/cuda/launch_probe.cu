// A CUDA C++ probe, not part of the build: why fetchahead's decode-size gather costs more per
// call than a hand-written one when replayed from a CUDA graph (issue 24 item 4). One harness
// (a graph of 100 launches in a chain, replayed 200 times, timed with events, cases interleaved
// over 7 rounds, medians printed), one table (16M rows x 256 bytes, 4 GiB, random int64 ids),
// the same grid (a thread per 16-byte chunk, 256 threads a block), and these kernels:
//   cuda-ld      the gather written here, plain loads, launched with <<<>>>
//   cuda-ldg     the same with read-only (`ld.global.nc`) loads
//   cuda-ld/jit  cuda-ld compiled to PTX by nvcc and JIT-loaded by the driver (argv[2])
//   fa           fetchahead's `gather_chunk16_nohint` from its PTX (argv[1]), cuLaunchKernel
//                (its default at 72 and 4096 rows until `gather_words8_pass` replaced it)
//   fa-empty     fetchahead's `gather_empty` with the same grid and parameters
//   cuda-ld/bN   cuda-ld in blocks of N threads (the same thread per chunk)
//   cuda-w4, -w8 the gather with 4- or 8-byte words (more threads a row), 256-thread blocks
//   tri          the Triton peer's SASS written in CUDA: 4-byte words, a row per 64 threads, no
//                loop, 32-bit indices, the id not checked against the table
//   tri+check    the same with the id checked (a bad id's row left unwritten)
//   tri+loop     the same in a grid-stride loop
//   triton       the Triton peer's own cubin (argv[3], entry `gather_peer`, 256 threads a
//                program, ROWS = 4 rows a program at 72 and 8 at 4096: argv[3] and argv[4])
// and for gather + MXFP8 dequant (256 E4M3 bytes and 8 E8M0 scales a row, bf16 out; a thread per
// 8 elements, 256 threads a block):
//   cuda-dq      a dequant written here (normal numbers only: a timing stand-in, not exact)
//   fa-dq        fetchahead's `gather_dequant_u8_packed` (its default at 72 rows until
//                `_b128` replaced it)
//   fa-dq-x2     fetchahead's `gather_dequant_u8_packed_x2` (its default at 4096 rows; half
//                the threads, two units each)
// On the GPU machine:
//   nvcc -O3 -arch=sm_90 -std=c++17 benches/cuda/launch_probe.cu -lcuda -o /tmp/lp
//   nvcc -ptx -O3 -arch=sm_90 -std=c++17 benches/cuda/launch_probe.cu -o /tmp/lp.ptx
//   /tmp/lp path/to/fetchahead_gpu.ptx /tmp/lp.ptx [triton_rows4.cubin triton_rows8.cubin]
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "probe.h"

struct Params {
  const uint4* table;
  const int64_t* ids;
  uint4* out;
  uint64_t n;
  uint64_t rows;
};

extern "C" __global__ void probe_gather_ld(Params p) { gather_chunks(p); }

// The same with W-byte words (W = 4, 8): 256 / W threads a row.
template <typename Word>
__global__ void probe_gather_words(Params p) {
  constexpr uint64_t per_row = 256 / sizeof(Word);
  const Word* table = (const Word*)p.table;
  Word* out = (Word*)p.out;
  uint64_t t = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x;
  uint64_t total = p.n * per_row;
  for (; t < total; t += (uint64_t)gridDim.x * blockDim.x) {
    uint64_t i = t / per_row, c = t % per_row;
    int64_t id = p.ids[i];
    if (id >= 0 && (uint64_t)id < p.rows) out[t] = table[id * per_row + c];
  }
}

__global__ void __launch_bounds__(256) probe_gather_tri(Params p) {
  int row = blockIdx.x * 4 + (threadIdx.x >> 6);
  if (row < (int)p.n) {
    int64_t id = p.ids[row];
    uint32_t w = (threadIdx.x & 63) * 4;
    uint32_t v = *(const uint32_t*)((const uint8_t*)p.table + (id << 8) + w);
    *(uint32_t*)((uint8_t*)p.out + (row << 8) + w) = v;
  }
}

__global__ void __launch_bounds__(256) probe_gather_tri_check(Params p) {
  int row = blockIdx.x * 4 + (threadIdx.x >> 6);
  if (row < (int)p.n) {
    int64_t id = p.ids[row];
    if (id < 0 || (uint64_t)id >= p.rows) return;
    uint32_t w = (threadIdx.x & 63) * 4;
    uint32_t v = *(const uint32_t*)((const uint8_t*)p.table + (id << 8) + w);
    *(uint32_t*)((uint8_t*)p.out + (row << 8) + w) = v;
  }
}

__global__ void __launch_bounds__(256) probe_gather_tri_loop(Params p) {
  for (int row = blockIdx.x * 4 + (threadIdx.x >> 6); row < (int)p.n; row += gridDim.x * 4) {
    int64_t id = p.ids[row];
    uint32_t w = (threadIdx.x & 63) * 4;
    uint32_t v = *(const uint32_t*)((const uint8_t*)p.table + (id << 8) + w);
    *(uint32_t*)((uint8_t*)p.out + (row << 8) + w) = v;
  }
}

extern "C" __global__ void probe_gather_ldg(Params p) {
  uint64_t t = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x;
  uint64_t total = p.n * 16;
  for (; t < total; t += (uint64_t)gridDim.x * blockDim.x) {
    uint64_t i = t >> 4, c = t & 15;
    int64_t id = __ldg(p.ids + i);
    if (id >= 0 && (uint64_t)id < p.rows) p.out[t] = __ldg(p.table + id * 16 + c);
  }
}

struct DqParams {
  const uint8_t* weights;
  const uint8_t* scales;
  const int64_t* ids;
  uint4* out;
  uint64_t n;
  uint64_t rows;
};

// bf16 bits of e4m3 byte `b` times 2^(s - 127), for normal e4m3 values (timing only).
__device__ __forceinline__ uint32_t bf16_of(uint32_t b, uint32_t s) {
  uint32_t sign = (b & 0x80) << 8, e = (b >> 3) & 15, m = b & 7;
  uint32_t exp = e ? e + s - 7 : 0;
  return sign | (exp & 0xff) << 7 | m << 4;
}

extern "C" __global__ void probe_dequant(DqParams p) {
  uint64_t t = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x;
  uint64_t total = p.n * 32;
  for (; t < total; t += (uint64_t)gridDim.x * blockDim.x) {
    uint64_t i = t >> 5, u = t & 31;
    int64_t id = p.ids[i];
    if (id < 0 || (uint64_t)id >= p.rows) continue;
    uint2 w = *(const uint2*)(p.weights + id * 256 + u * 8);
    uint32_t s = p.scales[id * 8 + u / 4];
    uint4 o;
    o.x = bf16_of(w.x & 255, s) | bf16_of((w.x >> 8) & 255, s) << 16;
    o.y = bf16_of((w.x >> 16) & 255, s) | bf16_of(w.x >> 24, s) << 16;
    o.z = bf16_of(w.y & 255, s) | bf16_of((w.y >> 8) & 255, s) << 16;
    o.w = bf16_of((w.y >> 16) & 255, s) | bf16_of(w.y >> 24, s) << 16;
    p.out[t] = o;
  }
}

int main(int argc, char** argv) {
  if (argc < 3) {
    printf("usage: %s FETCHAHEAD_PTX PROBE_PTX\n", argv[0]);
    return 2;
  }
  CK(cudaFree(0));
  std::string fa_ptx = read_file(argv[1]), probe_ptx = read_file(argv[2]);
  CUmodule fa_mod, probe_mod;
  CU(cuModuleLoadData(&fa_mod, fa_ptx.c_str()));
  CU(cuModuleLoadData(&probe_mod, probe_ptx.c_str()));
  CUfunction fa_gather, fa_empty, jit_ld, fa_dq, fa_dq2;
  CU(cuModuleGetFunction(&fa_dq, fa_mod, "gather_dequant_u8_packed"));
  CU(cuModuleGetFunction(&fa_dq2, fa_mod, "gather_dequant_u8_packed_x2"));
  CU(cuModuleGetFunction(&fa_gather, fa_mod, "gather_chunk16_nohint"));
  CU(cuModuleGetFunction(&fa_empty, fa_mod, "gather_empty"));
  CU(cuModuleGetFunction(&jit_ld, probe_mod, "probe_gather_ld"));
  // The Triton peer's cubins (ROWS = 4 and 8), when given.
  CUfunction triton[2] = {nullptr, nullptr};
  for (int k = 0; k < 2 && argc > 3 + k; k++) {
    std::string cubin = read_file(argv[3 + k]);
    CUmodule m;
    CU(cuModuleLoadData(&m, cubin.data()));
    CU(cuModuleGetFunction(&triton[k], m, "gather_peer"));
  }
  int regs;
  CU(cuFuncGetAttribute(&regs, CU_FUNC_ATTRIBUTE_NUM_REGS, fa_gather));
  printf("fa gather_chunk16_nohint: %d registers\n", regs);
  CU(cuFuncGetAttribute(&regs, CU_FUNC_ATTRIBUTE_NUM_REGS, jit_ld));
  printf("probe_gather_ld (JIT): %d registers\n", regs);

  const uint64_t rows = 16ull << 20;
  uint4* table;
  int64_t* ids;
  uint4* out;
  uint64_t* status;
  CK(cudaMalloc(&table, rows * 256));
  CK(cudaMemset(table, 7, rows * 256));
  CK(cudaMalloc(&out, 4096 * 512));
  uint8_t* scales;
  CK(cudaMalloc(&scales, rows * 8));
  CK(cudaMemset(scales, 127, rows * 8));
  CK(cudaMalloc(&status, 16));
  std::vector<uint64_t> clean = {0, ~0ull};
  CK(cudaMemcpy(status, clean.data(), 16, cudaMemcpyHostToDevice));
  ids = device_ids(rows, 88172645463325252ull);
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const char* names[] = {"cuda-ld",     "cuda-ldg",     "cuda-ld/jit",   "fa",
                         "fa-empty",    "cuda-dq",      "fa-dq",         "fa-dq-x2",
                         "cuda-ld/b32", "cuda-ld/b64",  "cuda-ld/b128",  "cuda-ld/b512",
                         "cuda-ld/b1024", "cuda-w4",    "cuda-w8",       "cuda-dq/b64",
                         "cuda-dq/b128", "tri",         "tri+check",     "tri+loop",
                         "triton"};
  for (uint64_t n : {72ull, 4096ull}) {
    unsigned blocks = (n * 16 + 255) / 256;
    Params p{table, ids, out, n, rows};
    FaGatherParams fp{(uint64_t)table, (uint64_t)ids, (uint64_t)out, n, rows, 256, 0,
                      (uint64_t)status, 0, 0, 0xffffffffu};
    DqParams dp{(const uint8_t*)table, scales, ids, out, n, rows};
    FaDequantParams fdp{(uint64_t)table, (uint64_t)scales, (uint64_t)ids, (uint64_t)out, rows,
                        (uint32_t)n, 256, (uint64_t)status, 0, 0, 0xffffffffu};
    unsigned dq_blocks = (n * 32 + 255) / 256, dq2_blocks = (n * 16 + 255) / 256;
    auto drv_grid = [&](CUfunction f, void* params, unsigned grid) {
      return [=](cudaStream_t st) {
        void* args[] = {params};
        CU(cuLaunchKernel(f, grid, 1, 1, 256, 1, 1, 0, (CUstream)st, args, nullptr));
      };
    };
    auto drv = [&](CUfunction f, void* params) { return drv_grid(f, params, blocks); };
    std::vector<std::function<void(cudaStream_t)>> cases = {
        [&](cudaStream_t st) { probe_gather_ld<<<blocks, 256, 0, st>>>(p); },
        [&](cudaStream_t st) { probe_gather_ldg<<<blocks, 256, 0, st>>>(p); },
        drv(jit_ld, &p),
        drv(fa_gather, &fp),
        drv(fa_empty, &fp),
        [&](cudaStream_t st) { probe_dequant<<<dq_blocks, 256, 0, st>>>(dp); },
        drv_grid(fa_dq, &fdp, dq_blocks),
        drv_grid(fa_dq2, &fdp, dq2_blocks),
    };
    for (unsigned b : {32u, 64u, 128u, 512u, 1024u}) {
      unsigned g = (n * 16 + b - 1) / b;
      cases.push_back([=](cudaStream_t st) { probe_gather_ld<<<g, b, 0, st>>>(p); });
    }
    cases.push_back([=](cudaStream_t st) {
      probe_gather_words<uint32_t><<<(n * 64 + 255) / 256, 256, 0, st>>>(p);
    });
    cases.push_back([=](cudaStream_t st) {
      probe_gather_words<uint2><<<(n * 32 + 255) / 256, 256, 0, st>>>(p);
    });
    for (unsigned b : {64u, 128u}) {
      unsigned g = (n * 32 + b - 1) / b;
      cases.push_back([=](cudaStream_t st) { probe_dequant<<<g, b, 0, st>>>(dp); });
    }
    unsigned tri_blocks = (n + 3) / 4;
    cases.push_back([=](cudaStream_t st) { probe_gather_tri<<<tri_blocks, 256, 0, st>>>(p); });
    cases.push_back([=](cudaStream_t st) { probe_gather_tri_check<<<tri_blocks, 256, 0, st>>>(p); });
    cases.push_back([=](cudaStream_t st) { probe_gather_tri_loop<<<tri_blocks, 256, 0, st>>>(p); });
    CUfunction tf = triton[n == 72 ? 0 : 1];
    unsigned rows_per = n == 72 ? 4 : 8;
    if (tf) {
      cases.push_back([=](cudaStream_t st) {
        uint64_t a0 = (uint64_t)table, a1 = (uint64_t)ids, a2 = (uint64_t)out, z = 0;
        uint32_t nn = (uint32_t)n;
        void* args[] = {&a0, &a1, &a2, &nn, &z, &z};
        CU(cuLaunchKernel(tf, (n + rows_per - 1) / rows_per, 1, 1, 256, 1, 1, 0, (CUstream)st,
                          args, nullptr));
      });
    }
    std::vector<std::vector<float>> got(cases.size());
    for (int round = 0; round < 7; round++)
      for (size_t c = 0; c < cases.size(); c++) got[c].push_back(time_graph(cases[c], s));
    for (size_t c = 0; c < cases.size(); c++) {
      auto v = got[c];
      std::sort(v.begin(), v.end());
      printf("n=%-5lu %-12s %.3f us a call (min %.3f, max %.3f)\n", n, names[c], v[3], v[0],
             v[6]);
    }
  }
  return 0;
}
