// A CUDA C++ probe, not part of the build: whether a decode-size call's cost (72 and 4096 rows
// of 256 bytes, replayed from a graph) comes from the kernel's code or from where it lives
// (issue 24 item 4). One harness times, on the same tensors and the same grids:
//   nvcc        the kernel of that shape written here (`decode_shape_probe.cu`'s gather at
//               8 bytes a thread in blocks of 256, its dequant stand-in at 8 elements in 128)
//   fa          fetchahead's width build from its whole PTX (argv[1], every kernel in one module)
//   fa/alone    the same entry from a module holding only it (cut from that PTX here)
//   fa/reqntid  that module with the block size declared (`.reqntid`, as Triton's PTX has;
//               build.rs now writes it on the width builds, so from such a PTX it is fa/alone)
//   fa/sm_90a   that module targeting sm_90a (Triton's target)
//   triton      the Triton peer's cubin (argv[2]/NAME.cubin, `benches/triton/dump_peers.py`)
//   triton/jit  the same peer's PTX, JIT-loaded by the driver
//   fa/before   the entry from another build's whole PTX (argv[3], optional): the build a
//               change is measured against
// and fetchahead's empty kernel from both modules. Each case is a graph of 100 chained launches
// replayed 200 times; cases interleaved over 7 rounds; the median per call printed with the
// rounds' min and max.
// On the GPU machine:
//   python3 benches/triton/dump_peers.py /tmp/peers
//   nvcc -O3 -arch=sm_90 -std=c++17 benches/cuda/module_probe.cu -lcuda -o /tmp/mp
//   /tmp/mp path/to/fetchahead_gpu.ptx /tmp/peers [path/to/before.ptx]
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "probe.h"

constexpr uint32_t ROW = 256;

struct Params {
  const uint8_t* table;
  const uint8_t* scales;
  const int64_t* ids;
  uint8_t* out;
  uint32_t n;
  uint64_t rows;
};

__global__ void __launch_bounds__(256) nvcc_gather(Params p) {
  uint32_t t = blockIdx.x * 256 + threadIdx.x, i = t / 32, c = t % 32;
  bool live = i < p.n;
  int64_t id = live ? p.ids[i] : -1;
  bool found = id >= 0 && (uint64_t)id < p.rows;
  uint64_t v = found ? __ldg((const unsigned long long*)(p.table + id * ROW) + c) : 0;
  if (live) ((uint64_t*)(p.out + (uint64_t)i * ROW))[c] = v;
}

__global__ void __launch_bounds__(128) nvcc_dequant(Params p) {
  uint32_t t = blockIdx.x * 128 + threadIdx.x, i = t / 32, c = t % 32;
  bool live = i < p.n;
  int64_t id = live ? p.ids[i] : -1;
  bool found = id >= 0 && (uint64_t)id < p.rows;
  uint32_t s = found ? __ldg(p.scales + id * (ROW / 32) + c / 4) : 127;
  float scale = __uint_as_float(s << 23);
  uint2 w = found ? __ldg((const uint2*)(p.table + id * ROW) + c) : make_uint2(0, 0);
  uint32_t o[4];
  for (int k = 0; k < 4; k++) {
    uint32_t two = ((k < 2 ? w.x : w.y) >> (16 * (k & 1))) & 0xffff;
    float a = __uint_as_float(((two & 0x80) << 24) | ((two & 0x7f) << 20)) * 0x1p120f * scale;
    float b = __uint_as_float(((two & 0x8000) << 16) | ((two & 0x7f00) << 12)) * 0x1p120f * scale;
    __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    o[k] = *(uint32_t*)&h;
  }
  if (live) ((uint4*)(p.out + (uint64_t)i * ROW * 2))[c] = make_uint4(o[0], o[1], o[2], o[3]);
}

// A PTX module holding only `entry`: the source's .version / .target / .address_size lines and
// the entry's text, from its `.visible .entry NAME(` to the first line that is a lone `}`.
std::string alone(const std::string& ptx, const std::string& entry) {
  std::string head;
  std::istringstream lines(ptx);
  for (std::string l; std::getline(lines, l);)
    if (l.rfind(".version", 0) == 0 || l.rfind(".target", 0) == 0 ||
        l.rfind(".address_size", 0) == 0)
      head += l + "\n";
  size_t at = ptx.find(".visible .entry " + entry + "(");
  size_t end = at == std::string::npos ? at : ptx.find("\n}\n", at);
  if (end == std::string::npos) {
    printf("no entry %s in the PTX\n", entry.c_str());
    exit(1);
  }
  return head + ptx.substr(at, end + 3 - at);
}

// `module` (one entry's, from `alone`) with `.reqntid threads` on the line after the entry's
// parameter list closes, unless it has one.
std::string with_reqntid(const std::string& module, unsigned threads) {
  if (module.find(".reqntid ") != std::string::npos) return module;  // build.rs wrote it
  size_t at = module.find("\n)");
  size_t end = at == std::string::npos ? at : module.find('\n', at + 1);
  if (end == std::string::npos) {
    printf("no parameter list in the module\n");
    exit(1);
  }
  std::string m = module;
  return m.insert(end + 1, ".reqntid " + std::to_string(threads) + "\n");
}

// `module` targeting `sm_90a` in place of its `.target` line.
std::string on_sm90a(const std::string& module) {
  size_t at = module.find(".target ");
  size_t end = at == std::string::npos ? at : module.find('\n', at);
  if (end == std::string::npos) {
    printf("no .target line in the module\n");
    exit(1);
  }
  std::string m = module;
  return m.replace(at, end - at, ".target sm_90a");
}


struct Case {
  std::string name;
  std::function<void(cudaStream_t)> launch;
};

int main(int argc, char** argv) {
  if (argc < 3) {
    printf("usage: %s FETCHAHEAD_PTX TRITON_DIR [BEFORE_PTX]\n", argv[0]);
    return 2;
  }
  CK(cudaFree(0));
  std::string fa_ptx = read_file(argv[1]), dir = argv[2];
  const char* gather = "gather_words8_pass_w256";
  const char* dequant = "gather_dequant_unit_pass_b128_w256";
  CUfunction fa_g = load_entry(fa_ptx, gather), fa_d = load_entry(fa_ptx, dequant),
             fa_e = load_entry(fa_ptx, "gather_empty");
  CUfunction fa_g1 = load_entry(alone(fa_ptx, gather), gather),
             fa_d1 = load_entry(alone(fa_ptx, dequant), dequant),
             fa_e1 = load_entry(alone(fa_ptx, "gather_empty"), "gather_empty");
  std::string before_ptx = argc > 3 ? read_file(argv[3]) : std::string();
  CUfunction fa_gb = argc > 3 ? load_entry(before_ptx, gather) : nullptr,
             fa_db = argc > 3 ? load_entry(before_ptx, dequant) : nullptr;
  CUfunction fa_gr = load_entry(with_reqntid(alone(fa_ptx, gather), 256), gather),
             fa_dr = load_entry(with_reqntid(alone(fa_ptx, dequant), 128), dequant),
             fa_ga = load_entry(on_sm90a(alone(fa_ptx, gather)), gather),
             fa_da = load_entry(on_sm90a(alone(fa_ptx, dequant)), dequant);

  DecodeTensors tensors = decode_tensors();  // 4 GiB of 256-byte rows
  const uint64_t rows = tensors.rows;
  uint8_t *table = tensors.table, *scales = tensors.scales, *out = tensors.out;
  int64_t* ids = tensors.ids;
  uint64_t* status;
  CK(cudaMalloc(&status, 16));
  std::vector<uint64_t> clean = {0, ~0ull};
  CK(cudaMemcpy(status, clean.data(), 16, cudaMemcpyHostToDevice));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

  for (uint32_t n : {72u, 4096u}) {
    Params p{table, scales, ids, out, n, rows};
    FaGatherParams fg{(uint64_t)table, (uint64_t)ids, (uint64_t)out, n, rows, ROW, 0,
                (uint64_t)status, 0, 0, 0xffffffffu};
    FaDequantParams fd{(uint64_t)table, (uint64_t)scales, (uint64_t)ids, (uint64_t)out, rows, n, ROW,
                 (uint64_t)status, 0, 0, 0xffffffffu};
    unsigned g_blocks = (n * 32 + 255) / 256, d_blocks = (n * 32 + 127) / 128;
    auto drv = [](CUfunction f, void* params, unsigned grid, unsigned block) {
      return [=](cudaStream_t st) {
        void* args[] = {params};
        CU(cuLaunchKernel(f, grid, 1, 1, block, 1, 1, 0, (CUstream)st, args, nullptr));
      };
    };
    // The peers' configs at this size; Triton's kernels take two scratch pointers last.
    int g_rows = n == 72 ? 4 : 16, g_warps = n == 72 ? 4 : 8;
    int d_rows = n == 72 ? 4 : 8, d_warps = 8;
    std::string g_stem = dir + "/gather_r" + std::to_string(g_rows) + "w" + std::to_string(g_warps);
    std::string d_stem = dir + "/dequant_r" + std::to_string(d_rows) + "w" + std::to_string(d_warps);
    CUfunction tg = load_entry(read_file(g_stem + ".cubin"), "gather_peer"),
               tg_jit = load_entry(read_file(g_stem + ".ptx"), "gather_peer"),
               td = load_entry(read_file(d_stem + ".cubin"), "dequant_peer"),
               td_jit = load_entry(read_file(d_stem + ".ptx"), "dequant_peer");
    static uint64_t a_table, a_scales, a_ids, a_out, zero;
    static uint32_t a_n;
    a_table = (uint64_t)table, a_scales = (uint64_t)scales, a_ids = (uint64_t)ids;
    a_out = (uint64_t)out, a_n = n, zero = 0;
    auto triton_gather = [=](CUfunction f) {
      return [=](cudaStream_t st) {
        void* args[] = {&a_table, &a_ids, &a_out, &a_n, &zero, &zero};
        CU(cuLaunchKernel(f, (n + g_rows - 1) / g_rows, 1, 1, 32 * g_warps, 1, 1, 0,
                          (CUstream)st, args, nullptr));
      };
    };
    auto triton_dequant = [=](CUfunction f) {
      return [=](cudaStream_t st) {
        void* args[] = {&a_table, &a_scales, &a_ids, &a_out, &a_n, &zero, &zero};
        CU(cuLaunchKernel(f, (n + d_rows - 1) / d_rows, 1, 1, 32 * d_warps, 1, 1, 0,
                          (CUstream)st, args, nullptr));
      };
    };
    std::vector<Case> cases = {
        {"gather nvcc", [&](cudaStream_t st) { nvcc_gather<<<g_blocks, 256, 0, st>>>(p); }},
        {"gather fa", drv(fa_g, &fg, g_blocks, 256)},
        {"gather fa/alone", drv(fa_g1, &fg, g_blocks, 256)},
        {"gather fa/reqntid", drv(fa_gr, &fg, g_blocks, 256)},
        {"gather fa/sm_90a", drv(fa_ga, &fg, g_blocks, 256)},
        {"gather triton", triton_gather(tg)},
        {"gather triton/jit", triton_gather(tg_jit)},
        {"dequant nvcc", [&](cudaStream_t st) { nvcc_dequant<<<d_blocks, 128, 0, st>>>(p); }},
        {"dequant fa", drv(fa_d, &fd, d_blocks, 128)},
        {"dequant fa/alone", drv(fa_d1, &fd, d_blocks, 128)},
        {"dequant fa/reqntid", drv(fa_dr, &fd, d_blocks, 128)},
        {"dequant fa/sm_90a", drv(fa_da, &fd, d_blocks, 128)},
        {"dequant triton", triton_dequant(td)},
        {"dequant triton/jit", triton_dequant(td_jit)},
        {"empty fa", drv(fa_e, &fg, g_blocks, 256)},
        {"empty fa/alone", drv(fa_e1, &fg, g_blocks, 256)},
    };
    if (fa_gb) {
      cases.push_back({"gather fa/before", drv(fa_gb, &fg, g_blocks, 256)});
      cases.push_back({"dequant fa/before", drv(fa_db, &fd, d_blocks, 128)});
    }
    std::vector<std::vector<float>> got(cases.size());
    for (int round = 0; round < 7; round++)
      for (size_t k = 0; k < cases.size(); k++) got[k].push_back(time_graph(cases[k].launch, s));
    for (size_t k = 0; k < cases.size(); k++) {
      auto v = got[k];
      std::sort(v.begin(), v.end());
      printf("module n=%-5u %-20s: %.3f us a call (min %.3f, max %.3f)\n", n,
             cases[k].name.c_str(), v[3], v[0], v[6]);
    }
  }
  CK(cudaGetLastError());
  return 0;
}
