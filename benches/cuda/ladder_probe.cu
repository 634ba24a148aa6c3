// A CUDA C++ harness, not part of the build: what of the decode-size gap to the Triton peer
// (issue 24 item 4) is fetchahead's contract (each id checked against the table, a bad id's
// row written as zeros and recorded) and what is the code and the tile. One process times, at
// 72 and 4096 rows of 256 bytes on the same tensors, each launch replayed from a graph of 100:
//   fa/ENTRY      fetchahead's decode-size width builds from its PTX (argv[1]), on the grids its
//                 host sizes
//   lad/ENTRY     `gather_ladder.ptx` (argv[3]): fetchahead's gather written by hand, one change
//                 a rung toward the peer's code (the file's head says which)
//   tri/STEM      every build of `benches/triton/ladder_peers.py` (argv[2]/ladder.txt): the
//                 Triton peers at each ROWS and warps, as written (`plain`), with the id checked
//                 (`checked`) and with bad ids recorded too (`recorded`)
// and fetchahead's empty kernel. Cases interleaved over 7 rounds; the median per call printed
// with the rounds' min and max, then each family's cases sorted.
// On the GPU machine:
//   python3 benches/triton/ladder_peers.py /tmp/ladder
//   nvcc -O3 -arch=sm_90 -std=c++17 benches/cuda/ladder_probe.cu -lcuda -o /tmp/lp
//   /tmp/lp path/to/fetchahead_gpu.ptx /tmp/ladder benches/cuda/gather_ladder.ptx
#include <algorithm>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "probe.h"

constexpr uint32_t ROW = 256;


struct Case {
  std::string family, name;
  std::function<void(cudaStream_t)> launch;
};

struct Build {
  std::string stem, family, args, entry;
  int rows, warps;
  unsigned shared;  // the dynamic shared memory its launch must give it
};

int main(int argc, char** argv) {
  if (argc < 4) {
    printf("usage: %s FETCHAHEAD_PTX LADDER_DIR GATHER_LADDER_PTX\n", argv[0]);
    return 2;
  }
  CK(cudaFree(0));
  std::string fa_ptx = read_file(argv[1]), dir = argv[2], lad_ptx = read_file(argv[3]);
  std::vector<Build> builds;
  {
    std::istringstream lines(read_file(dir + "/ladder.txt"));
    for (std::string l; std::getline(lines, l);) {
      Build b;
      std::istringstream w(l);
      if (w >> b.stem >> b.family >> b.args >> b.rows >> b.warps >> b.entry >> b.shared)
        builds.push_back(b);
    }
  }
  printf("%zu Triton builds\n", builds.size());

  DecodeTensors tensors = decode_tensors();  // 4 GiB of 256-byte rows
  const uint64_t rows = tensors.rows;
  uint8_t *table = tensors.table, *scales = tensors.scales, *out = tensors.out;
  int64_t* ids = tensors.ids;
  uint64_t *status, *tri_status;
  CK(cudaMalloc(&status, 16));
  CK(cudaMalloc(&tri_status, 16));
  std::vector<uint64_t> clean = {0, ~0ull};
  CK(cudaMemcpy(status, clean.data(), 16, cudaMemcpyHostToDevice));
  std::vector<uint64_t> tri_clean = {0, (uint64_t)INT64_MAX};
  CK(cudaMemcpy(tri_status, tri_clean.data(), 16, cudaMemcpyHostToDevice));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

  // fetchahead's entries: name, family, threads a block, threads a row.
  struct Fa {
    const char* entry;
    const char* family;
    unsigned block, per_row;
  };
  std::vector<Fa> fa = {
      {"gather_words8_pass_w256", "gather", 256, 32},
      {"gather_words16_pass_w256", "gather", 256, 16},
      {"gather_dequant_unit_pass_b64_w256", "dequant", 64, 32},
      {"gather_dequant_unit_pass_b128_w256", "dequant", 128, 32},
      {"gather_dequant_unit_pass_b256_w256", "dequant", 256, 32},
      {"gather_dequant_quad_pass_b128_w256", "dequant", 128, 64},
      {"gather_dequant_quad_pass_b256_w256", "dequant", 256, 64},
      {"gather_dequant_quad_pass_cvt_b256_w256", "dequant", 256, 64},
      {"gather_dequant_unit_pass_cvt_b128_w256", "dequant", 128, 32},
      {"gather_empty", "empty", 256, 32},
  };
  // The ladder's entries: name, threads a block, threads a row.
  std::vector<std::tuple<const char*, unsigned, unsigned>> lad = {
      {"lad_fa", 256, 32},     {"lad_plain", 256, 32},  {"lad_nocheck", 256, 32},
      {"lad_clamp", 256, 32},  {"lad_b128", 128, 32},   {"lad_s32", 256, 32},
      {"lad_tri", 256, 32},    {"lad_tri128", 128, 32}, {"lad16_tri", 256, 16},
      {"lad16_s32", 256, 16},
  };
  std::vector<CUfunction> fa_f, lad_f, tri_f;
  for (auto& e : fa) fa_f.push_back(load_entry(fa_ptx, e.entry));
  for (auto& e : lad) lad_f.push_back(load_entry(lad_ptx, std::get<0>(e)));
  for (auto& b : builds) tri_f.push_back(load_entry(read_file(dir + "/" + b.stem + ".cubin"), b.entry.c_str()));

  for (uint32_t n : {72u, 4096u}) {
    static FaGatherParams fg;
    static FaDequantParams fd;
    fg = {(uint64_t)table, (uint64_t)ids, (uint64_t)out, n, rows, ROW, 0, (uint64_t)status, 0, 0,
          0xffffffffu};
    fd = {(uint64_t)table, (uint64_t)scales, (uint64_t)ids, (uint64_t)out, rows, n, ROW,
          (uint64_t)status, 0, 0, 0xffffffffu};
    static uint64_t a_table, a_scales, a_ids, a_out, a_rows, a_status, zero;
    static uint32_t a_n;
    a_table = (uint64_t)table, a_scales = (uint64_t)scales, a_ids = (uint64_t)ids;
    a_out = (uint64_t)out, a_n = n, a_rows = rows, a_status = (uint64_t)tri_status, zero = 0;
    std::vector<Case> cases;
    auto drv = [](CUfunction f, void* params, unsigned grid, unsigned block) {
      return [=](cudaStream_t st) {
        void* args[] = {params};
        CU(cuLaunchKernel(f, grid, 1, 1, block, 1, 1, 0, (CUstream)st, args, nullptr));
      };
    };
    for (size_t k = 0; k < fa.size(); k++) {
      unsigned threads = n * fa[k].per_row, grid = (threads + fa[k].block - 1) / fa[k].block;
      void* params = fa[k].family[0] == 'd' ? (void*)&fd : (void*)&fg;
      cases.push_back({fa[k].family, std::string("fa/") + fa[k].entry,
                       drv(fa_f[k], params, grid, fa[k].block)});
    }
    for (size_t k = 0; k < lad.size(); k++) {
      auto [name, block, per_row] = lad[k];
      unsigned grid = (n * per_row + block - 1) / block;
      cases.push_back({"gather", std::string("lad/") + name, drv(lad_f[k], &fg, grid, block)});
    }
    for (size_t k = 0; k < builds.size(); k++) {
      const Build& b = builds[k];
      CUfunction f = tri_f[k];
      unsigned grid = (n + b.rows - 1) / b.rows, block = 32 * b.warps, shared = b.shared;
      bool gather = b.family == "gather", checked = b.args != "plain";
      cases.push_back({b.family, "tri/" + b.stem, [=](cudaStream_t st) {
                         std::vector<void*> args = {&a_table};
                         if (!gather) args.push_back(&a_scales);
                         args.insert(args.end(), {&a_ids, &a_out, &a_n});
                         if (checked) args.insert(args.end(), {&a_rows, &a_status});
                         args.insert(args.end(), {&zero, &zero});
                         CU(cuLaunchKernel(f, grid, 1, 1, block, 1, 1, shared, (CUstream)st,
                                           args.data(), nullptr));
                       }});
    }
    // Each case once, alone, its output checked: every gathered byte is the table's 0x3a, every
    // dequantized element FP8-E4M3 0x3a (1.25) times 2^0, bf16 0x3fa0. A case that faults or
    // writes anything else is named, and the probe stops (a fault ends the context).
    std::vector<uint8_t> host(n * ROW * 2);
    for (auto& c : cases) {
      if (c.family == "empty") continue;
      bool gather = c.family == "gather";
      size_t bytes = n * ROW * (gather ? 1 : 2);
      CK(cudaMemsetAsync(out, 0, bytes, s));
      c.launch(s);
      cudaError_t e = cudaStreamSynchronize(s);
      if (e) {
        printf("%s at n=%u: %s\n", c.name.c_str(), n, cudaGetErrorString(e));
        return 1;
      }
      CK(cudaMemcpy(host.data(), out, bytes, cudaMemcpyDeviceToHost));
      for (size_t k = 0; k < bytes; k++) {
        uint8_t want = gather ? 0x3a : (k % 2 ? 0x3f : 0xa0);
        if (host[k] != want) {
          printf("%s at n=%u: byte %zu is 0x%02x, want 0x%02x\n", c.name.c_str(), n, k, host[k],
                 want);
          return 1;
        }
      }
    }
    printf("n=%u: all %zu cases wrote the expected rows\n", n, cases.size());
    std::vector<std::vector<float>> got(cases.size());
    for (int round = 0; round < 7; round++)
      for (size_t k = 0; k < cases.size(); k++) got[k].push_back(time_graph(cases[k].launch, s));
    std::vector<std::pair<float, size_t>> order;
    for (size_t k = 0; k < cases.size(); k++) {
      auto& v = got[k];
      std::sort(v.begin(), v.end());
      order.push_back({v[3], k});
    }
    std::sort(order.begin(), order.end(), [&](auto& a, auto& b) {
      return cases[a.second].family != cases[b.second].family
                 ? cases[a.second].family < cases[b.second].family
                 : a.first < b.first;
    });
    for (auto& [median, k] : order)
      printf("ladder n=%-5u %-8s %-42s: %.3f us a call (min %.3f, max %.3f)\n", n,
             cases[k].family.c_str(), cases[k].name.c_str(), median, got[k][0], got[k][6]);
  }
  // Every id is inside the table, so no kernel may have recorded one.
  std::vector<uint64_t> after(2), tri_after(2);
  CK(cudaMemcpy(after.data(), status, 16, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(tri_after.data(), tri_status, 16, cudaMemcpyDeviceToHost));
  printf("bad ids recorded: fetchahead %llu, Triton %llu (want 0, 0)\n",
         (unsigned long long)(after[0] & 0xffffffff), (unsigned long long)tri_after[0]);
  CK(cudaGetLastError());
  return 0;
}
