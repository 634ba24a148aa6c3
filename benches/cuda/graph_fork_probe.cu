// A CUDA C++ probe, not part of the build: what the L2 plan's side branch costs and buys a chain
// of collective windows, eagerly and replayed from a CUDA graph, split into its parts. Per window:
// a spin kernel standing for the layer's compute, a simulated collective (4 blocks polling the
// clock), then a weight-bound reader of its own weights. Variants (each the whole chain, timed
// with events, interleaved over reps):
//   none      no branch
//   plan      a side stream forked after the spin (before the collective), a load-based L2
//             prefetch of the reader's first W bytes there, captured after the collective (the
//             plan's PrefetchLaunch::AfterCollective), joined once at the end
//   before    the same with the prefetch captured before the collective
//   empty     the same fork and join with an empty kernel on the branch: the fork's own cost
//   hand      the same bytes warmed on the main chain before the spin: the ideal without a branch
//   hand+fork hand, plus the empty branch: is the ideal and the fork's cost additive?
// On the GPU machine:
//   nvcc -O3 -arch=sm_90 -std=c++17 benches/cuda/graph_fork_probe.cu -lcuda -o /tmp/gf && /tmp/gf
#include "chain.h"
#include "probe.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

__global__ void empty() {}

enum Variant { NONE, PLAN, BEFORE, EMPTY, HAND, HAND_FORK, VARIANTS };
static const char* NAMES[] = {"none", "plan", "before", "empty", "hand", "hand+fork"};

struct Chain {
  int windows;
  uint64_t spin_ns, coll_ns;
  size_t weight_bytes, warm_bytes;
  std::vector<uint4*> weights;
  uint32_t* out;
  unsigned long long* st;  // 6 a window: collective, prefetch, reader (start, end)
  cudaStream_t main, side;
  std::vector<cudaEvent_t> forks;
  cudaEvent_t join;
  int sms;

  void enqueue(Variant v) {
    bool branch = v == PLAN || v == BEFORE || v == EMPTY || v == HAND_FORK;
    uint64_t warm_n = warm_bytes / 16, read_n = weight_bytes / 16;
    for (int k = 0; k < windows; ++k) {
      unsigned long long* w = st + 6 * k;
      if (v == HAND || v == HAND_FORK) prefetch_loads<<<12, 1024, 0, main>>>(weights[k], warm_n, w + 2);
      spin<<<sms, 32, 0, main>>>(spin_ns, nullptr);
      if (branch) {
        CK(cudaEventRecord(forks[k], main));
        CK(cudaStreamWaitEvent(side, forks[k], 0));
      }
      if (v == BEFORE) prefetch_loads<<<12, 1024, 0, side>>>(weights[k], warm_n, w + 2);
      spin<<<4, 32, 0, main>>>(coll_ns, w);  // the collective
      if (v == PLAN) prefetch_loads<<<12, 1024, 0, side>>>(weights[k], warm_n, w + 2);
      if (v == EMPTY || v == HAND_FORK) empty<<<1, 32, 0, side>>>();
      reader<<<sms * 4, 256, 0, main>>>(weights[k], read_n, out, w + 4);
    }
    if (branch) {
      CK(cudaEventRecord(join, side));
      CK(cudaStreamWaitEvent(main, join, 0));
    }
  }
};

int main(int argc, char** argv) {
  Chain c;
  c.windows = argc > 1 ? atoi(argv[1]) : 64;
  c.spin_ns = 50000;
  c.coll_ns = 26000;
  c.weight_bytes = (size_t)20 << 20;
  c.warm_bytes = (size_t)6 << 20;
  int reps = argc > 2 ? atoi(argv[2]) : 20;
  CK(cudaDeviceGetAttribute(&c.sms, cudaDevAttrMultiProcessorCount, 0));
  for (int k = 0; k < c.windows; ++k) {
    uint4* w;
    CK(cudaMalloc(&w, c.weight_bytes));
    CK(cudaMemset(w, k & 0xFF, c.weight_bytes));
    c.weights.push_back(w);
  }
  CK(cudaMalloc(&c.out, 4096 * 4));
  CK(cudaMalloc(&c.st, c.windows * 6 * sizeof(unsigned long long)));
  std::vector<unsigned long long> init(c.windows * 6), host(c.windows * 6);
  for (int i = 0; i < c.windows * 3; ++i) init[2 * i] = ~0ull, init[2 * i + 1] = 0;
  CK(cudaStreamCreateWithFlags(&c.main, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&c.side, cudaStreamNonBlocking));
  c.forks.resize(c.windows);
  for (auto& f : c.forks) CK(cudaEventCreateWithFlags(&f, cudaEventDisableTiming));
  CK(cudaEventCreateWithFlags(&c.join, cudaEventDisableTiming));
  cudaEvent_t t0, t1;
  CK(cudaEventCreate(&t0));
  CK(cudaEventCreate(&t1));
  // A flush between chains: more than L2 written, so that every chain starts cold.
  size_t flush_bytes = (size_t)256 << 20;
  void* flush;
  CK(cudaMalloc(&flush, flush_bytes));

  cudaGraphExec_t graphs[VARIANTS];
  for (int v = 0; v < VARIANTS; ++v) {
    cudaGraph_t g;
    CK(cudaStreamBeginCapture(c.main, cudaStreamCaptureModeThreadLocal));
    c.enqueue((Variant)v);
    CK(cudaStreamEndCapture(c.main, &g));
    CK(cudaGraphInstantiate(&graphs[v], g, 0));
    CK(cudaGraphUpload(graphs[v], c.main));
    CK(cudaGraphDestroy(g));
  }
  std::vector<double> ms[2][VARIANTS], rd[2][VARIANTS], ps[2][VARIANTS], po[2][VARIANTS],
      gp[2][VARIANTS];
  auto median = [](std::vector<double> x) {
    std::sort(x.begin(), x.end());
    return x[x.size() / 2];
  };
  for (int r = 0; r < reps + 2; ++r) {
    for (int graph = 0; graph < 2; ++graph) {
      for (int v = 0; v < VARIANTS; ++v) {
        CK(cudaMemsetAsync(flush, r & 0xFF, flush_bytes, c.main));
        CK(cudaMemcpyAsync(c.st, init.data(), init.size() * 8, cudaMemcpyHostToDevice, c.main));
        spin<<<1, 32, 0, c.main>>>(200000, nullptr);  // the host gets ahead of the chain
        CK(cudaEventRecord(t0, c.main));
        if (graph)
          CK(cudaGraphLaunch(graphs[v], c.main));
        else
          c.enqueue((Variant)v);
        CK(cudaEventRecord(t1, c.main));
        CK(cudaEventSynchronize(t1));
        float t;
        CK(cudaEventElapsedTime(&t, t0, t1));
        CK(cudaMemcpy(host.data(), c.st, host.size() * 8, cudaMemcpyDeviceToHost));
        double us = 0, pf_start = 0, pf_over = 0, gap = 0;
        for (int k = 0; k < c.windows; ++k) {
          const unsigned long long* h = &host[6 * k];
          us += (h[5] - h[4]) / 1e3;
          gap += ((double)h[4] - (double)h[1]) / 1e3;
          if (h[3]) {
            pf_start += ((double)h[2] - (double)h[0]) / 1e3;
            pf_over += ((double)h[3] - (double)h[1]) / 1e3;
          }
        }
        if (r >= 2) {
          ms[graph][v].push_back(t), rd[graph][v].push_back(us / c.windows);
          ps[graph][v].push_back(pf_start / c.windows), po[graph][v].push_back(pf_over / c.windows);
          gp[graph][v].push_back(gap / c.windows);
        }
      }
    }
  }
  printf("%d windows: spin %.0f us, collective %.0f us, reader %zu MiB, warmed %zu MiB; %d reps\n",
         c.windows, c.spin_ns / 1e3, c.coll_ns / 1e3, c.weight_bytes >> 20, c.warm_bytes >> 20,
         reps);
  for (int graph = 0; graph < 2; ++graph) {
    double med[VARIANTS], rmed[VARIANTS];
    for (int v = 0; v < VARIANTS; ++v) {
      auto x = ms[graph][v];
      std::sort(x.begin(), x.end());
      med[v] = x[x.size() / 2];
      auto y = rd[graph][v];
      std::sort(y.begin(), y.end());
      rmed[v] = y[y.size() / 2];
    }
    for (int v = 0; v < VARIANTS; ++v)
      printf("%s %-9s chain %.4f ms, saves %+.3f us a window; reader %.3f us, saves %+.3f us; "
             "prefetch starts %+.2f us after the collective, ends %+.2f us after it; reader "
             "starts %.2f us after the collective's end\n",
             graph ? "graph" : "eager", NAMES[v], med[v],
             (med[NONE] - med[v]) * 1e3 / c.windows, rmed[v], rmed[NONE] - rmed[v],
             median(ps[graph][v]), median(po[graph][v]), median(gp[graph][v]));
    double ideal = med[NONE] - med[HAND];
    printf("%s: plan realizes %.2f of the hand-warmed ideal (before: %.2f); fork alone costs "
           "%.3f us a window\n",
           graph ? "graph" : "eager", (med[NONE] - med[PLAN]) / ideal,
           (med[NONE] - med[BEFORE]) / ideal, (med[EMPTY] - med[NONE]) * 1e3 / c.windows);
  }
  return 0;
}
