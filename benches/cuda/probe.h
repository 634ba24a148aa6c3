// What the decode-size probes share (`param_block_probe.cu`, `launch_probe.cu`): error checks
// for the runtime and driver APIs, and the per-call time of a launch replayed from a graph.
#pragma once
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#define CK(x)                                                      \
  do {                                                             \
    cudaError_t e = (x);                                           \
    if (e) {                                                       \
      printf("err %s line %d\n", cudaGetErrorString(e), __LINE__); \
      exit(1);                                                     \
    }                                                              \
  } while (0)
#define CU(x)                                  \
  do {                                         \
    CUresult e = (x);                          \
    if (e) {                                   \
      const char* what;                        \
      cuGetErrorString(e, &what);              \
      printf("err %s line %d\n", what, __LINE__); \
      exit(1);                                 \
    }                                          \
  } while (0)

// Per-call microseconds of `launch` (one launch on stream s): a graph of `calls` launches in a
// chain, replayed `replays` times back to back between two events.
inline float time_graph(const std::function<void(cudaStream_t)>& launch, cudaStream_t s,
                        int calls = 100, int replays = 200) {
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  for (int k = 0; k < calls; k++) launch(s);
  CK(cudaStreamEndCapture(s, &g));
  CK(cudaGraphInstantiate(&ge, g, 0));
  for (int k = 0; k < 5; k++) CK(cudaGraphLaunch(ge, s));
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  CK(cudaEventRecord(a, s));
  for (int k = 0; k < replays; k++) CK(cudaGraphLaunch(ge, s));
  CK(cudaEventRecord(b, s));
  CK(cudaEventSynchronize(b));
  float ms;
  CK(cudaEventElapsedTime(&ms, a, b));
  CK(cudaGraphExecDestroy(ge));
  CK(cudaGraphDestroy(g));
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  return ms * 1e3f / (replays * calls);
}

// The probes' row gather, a thread per 16-byte chunk of 256-byte rows in a grid-stride loop, for
// any parameter struct with `table`, `ids`, `out`, `n` and `rows` (bad ids leave their rows).
template <typename P>
__device__ __forceinline__ void gather_chunks(const P& p) {
  uint64_t t = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x;
  uint64_t total = p.n * 16;
  for (; t < total; t += (uint64_t)gridDim.x * blockDim.x) {
    uint64_t i = t >> 4, c = t & 15;
    int64_t id = p.ids[i];
    if (id >= 0 && (uint64_t)id < p.rows) p.out[t] = p.table[id * 16 + c];
  }
}

// `count` ids below `rows` on the device, drawn from `seed` by xorshift.
inline int64_t* device_ids(uint64_t rows, uint64_t seed, int count = 4096) {
  std::vector<int64_t> h(count);
  uint64_t x = seed;
  for (auto& v : h) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    v = x % rows;
  }
  int64_t* ids;
  CK(cudaMalloc(&ids, count * 8));
  CK(cudaMemcpy(ids, h.data(), count * 8, cudaMemcpyHostToDevice));
  return ids;
}

// fetchahead's GatherParams and DequantParams (gpu/src/params.rs, gpu/src/timeline.rs), 72
// bytes each; the timeline off when `ring` is 0.
struct FaGatherParams {
  uint64_t table, ids, out, n, rows;
  uint32_t row_bytes, pad;
  uint64_t status, ring;
  uint32_t kernel, label;
};
struct FaDequantParams {
  uint64_t weights, scales, ids, out, rows;
  uint32_t n, dim;
  uint64_t status, ring;
  uint32_t kernel, label;
};

// `entry` of a module loaded from `image` (PTX text, JIT-compiled, or a cubin), or exit.
inline CUfunction load_entry(const std::string& image, const char* entry) {
  CUmodule m;
  CU(cuModuleLoadData(&m, image.data()));
  CUfunction f;
  CU(cuModuleGetFunction(&f, m, entry));
  return f;
}

// The decode-size probes' tensors: a 4 GiB table of 256-byte rows (every byte 0x3a), its
// E8M0 scales (all 2^0), room for 4096 output rows of bf16, and 4096 ids drawn below `rows`.
struct DecodeTensors {
  uint64_t rows;
  uint8_t *table, *scales, *out;
  int64_t* ids;
};
inline DecodeTensors decode_tensors() {
  constexpr uint64_t row = 256;
  DecodeTensors t{1 << 24, nullptr, nullptr, nullptr, nullptr};
  CK(cudaMalloc(&t.table, t.rows * row));
  CK(cudaMemset(t.table, 0x3a, t.rows * row));
  CK(cudaMalloc(&t.scales, t.rows * (row / 32)));
  CK(cudaMemset(t.scales, 127, t.rows * (row / 32)));
  CK(cudaMalloc(&t.out, 4096 * row * 2));
  t.ids = device_ids(t.rows, 88172645463325252ull);
  return t;
}

// A file's bytes (a PTX or a cubin), or exit.
inline std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) {
    printf("cannot read %s\n", path.c_str());
    exit(1);
  }
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}
