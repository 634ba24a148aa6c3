// A CUDA C++ probe, not part of the build: how the shape of the L2 plan's side branch in a
// captured graph changes what each window costs a replayed chain (issue 22). Per window, as in a
// decode step: a spin kernel on every SM standing for the layer's compute, a simulated
// collective (4 blocks polling the clock), then a streaming reader of its own weights. The branch
// carries one kernel a window (`empty`: one warp that does nothing, so only the branch's shape
// counts; `prefetch`: the reader's first W bytes loaded into L2 on all SMs but 16), joined once
// at the chain's end. Topologies:
//   none        no branch
//   chain       the plan today: an event after the spin, one side stream waiting on it, the
//               branch kernel captured before the collective (PrefetchLaunch::Auto in a capture)
//   chain-after the same, the branch kernel captured after the collective
//   pool4       as chain over four side streams taken in turn (each window's node depends on the
//               spin and on the window four back, not on the one before)
//   leaves      a side stream per window: each branch node depends on its spin alone
//   early       the event recorded before the spin (the branch runs beside the compute)
//   memop       no graph edge a window: the side stream forks once at the chain's start and
//               waits with cuStreamWaitValue32 on a flag the main stream sets with
//               cuStreamWriteValue32 after each spin; flags cleared after the join
//   memop-main  the main stream's flag writes alone (what memop adds to the main chain)
//   chain-prio  chain, the side stream at the highest priority, instantiated with node
//               priorities (PyTorch instantiates with cudaGraphInstantiateFlagUseNodePriority)
//   chain-np    chain instantiated with node priorities, default stream priorities
//   hand        (prefetch only) the same bytes warmed on the main stream before the spin: the
//               ideal, no branch
// Printed per topology, eager and replayed: the chain's time against `none` a window, and per
// window (medians over reps of the window means) the collective's start after its spin's end,
// the reader's start after its collective's end, the reader's time, and where the branch kernel
// ran against its collective.
// On the GPU machine:
//   nvcc -O3 -arch=sm_90 -std=c++17 benches/cuda/graph_branch_probe.cu -lcuda -o /tmp/gb
//   /tmp/gb empty && /tmp/gb prefetch
#include "chain.h"
#include "probe.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

// The branch's kernel when only the branch's shape should count: one warp that does nothing.
__global__ void empty(unsigned long long* st) {
  stamp_start(st);
  stamp_end(st);
}

enum Topo {
  NONE,
  CHAIN,
  CHAIN_AFTER,
  POOL4,
  LEAVES,
  EARLY,
  MEMOP,
  MEMOP_MAIN,
  CHAIN_PRIO,
  CHAIN_NP,
  HAND,
  TOPOS
};
static const char* NAMES[] = {"none",   "chain",      "chain-after", "pool4",    "leaves", "early",
                              "memop",  "memop-main", "chain-prio",  "chain-np", "hand"};

// Stamps a window: spin, collective, branch, reader (start, end each).
constexpr int STAMPS = 8;

struct Chain {
  int windows, sms;
  bool prefetch;
  uint64_t spin_ns, coll_ns;
  size_t weight_bytes, warm_bytes;
  std::vector<uint4*> weights;
  uint32_t* out;
  unsigned long long* st;
  uint32_t* flags;
  cudaStream_t main, side, side_hi;
  std::vector<cudaStream_t> leaves;
  std::vector<cudaEvent_t> forks, joins;
  cudaEvent_t join;

  void branch_kernel(int k, cudaStream_t s) {
    unsigned long long* w = st + STAMPS * k + 4;
    if (prefetch)
      prefetch_loads<<<sms - 16, 1024, 0, s>>>(weights[k], warm_bytes / 16, w);
    else
      empty<<<1, 32, 0, s>>>(w);
  }

  void enqueue(Topo t) {
    bool branch = t != NONE && t != HAND && t != MEMOP_MAIN;
    cudaStream_t side_of = t == CHAIN_PRIO ? side_hi : side;
    if (t == MEMOP) {
      CK(cudaEventRecord(join, main));
      CK(cudaStreamWaitEvent(side, join, 0));
    }
    for (int k = 0; k < windows; ++k) {
      unsigned long long* w = st + STAMPS * k;
      cudaStream_t s = side_of;
      if (t == POOL4) s = leaves[k % 4];
      if (t == LEAVES) s = leaves[k];
      if (t == HAND) prefetch_loads<<<sms - 16, 1024, 0, main>>>(weights[k], warm_bytes / 16, w + 4);
      if (t == EARLY) {
        CK(cudaEventRecord(forks[k], main));
        CK(cudaStreamWaitEvent(s, forks[k], 0));
        branch_kernel(k, s);
      }
      spin<<<sms, 32, 0, main>>>(spin_ns, w);
      if (t == MEMOP || t == MEMOP_MAIN)
        CU(cuStreamWriteValue32((CUstream)main, (CUdeviceptr)(flags + k), 1, 0));
      if (t == MEMOP) {
        CU(cuStreamWaitValue32((CUstream)side, (CUdeviceptr)(flags + k), 1,
                               CU_STREAM_WAIT_VALUE_GEQ));
        branch_kernel(k, side);
      }
      bool fork_here = branch && t != EARLY && t != MEMOP;
      if (fork_here) {
        CK(cudaEventRecord(forks[k], main));
        CK(cudaStreamWaitEvent(s, forks[k], 0));
        if (t != CHAIN_AFTER) branch_kernel(k, s);
      }
      spin<<<4, 32, 0, main>>>(coll_ns, w + 2);  // the collective
      if (t == CHAIN_AFTER) branch_kernel(k, s);
      reader<<<sms * 4, 256, 0, main>>>(weights[k], weight_bytes / 16, out, w + 6);
    }
    if (!branch) {
      if (t == MEMOP_MAIN) CK(cudaMemsetAsync(flags, 0, windows * 4, main));
      return;
    }
    if (t == POOL4 || t == LEAVES) {
      int n = t == POOL4 ? 4 : windows;
      for (int i = 0; i < n; ++i) {
        CK(cudaEventRecord(joins[i], leaves[i]));
        CK(cudaStreamWaitEvent(main, joins[i], 0));
      }
    } else {
      CK(cudaEventRecord(join, side_of));
      CK(cudaStreamWaitEvent(main, join, 0));
    }
    if (t == MEMOP) CK(cudaMemsetAsync(flags, 0, windows * 4, main));
  }
};

static double median(std::vector<double> x) {
  std::sort(x.begin(), x.end());
  return x.empty() ? 0 : x[x.size() / 2];
}

int main(int argc, char** argv) {
  Chain c;
  c.prefetch = argc > 1 && std::string(argv[1]) == "prefetch";
  c.windows = argc > 2 ? atoi(argv[2]) : 64;
  int reps = argc > 3 ? atoi(argv[3]) : 15;
  c.spin_ns = 40000;
  c.coll_ns = 25000;
  c.weight_bytes = (size_t)16 << 20;
  c.warm_bytes = (size_t)12 << 20;
  CK(cudaDeviceGetAttribute(&c.sms, cudaDevAttrMultiProcessorCount, 0));
  for (int k = 0; k < c.windows; ++k) {
    uint4* w;
    CK(cudaMalloc(&w, c.weight_bytes));
    CK(cudaMemset(w, k & 0xFF, c.weight_bytes));
    c.weights.push_back(w);
  }
  CK(cudaMalloc(&c.out, 4096 * 4));
  CK(cudaMalloc(&c.st, c.windows * STAMPS * sizeof(unsigned long long)));
  CK(cudaMalloc(&c.flags, c.windows * 4));
  CK(cudaMemset(c.flags, 0, c.windows * 4));
  std::vector<unsigned long long> init(c.windows * STAMPS), host(c.windows * STAMPS);
  for (size_t i = 0; i < init.size(); i += 2) init[i] = ~0ull, init[i + 1] = 0;
  int least, greatest;
  CK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  CK(cudaStreamCreateWithFlags(&c.main, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&c.side, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithPriority(&c.side_hi, cudaStreamNonBlocking, greatest));
  c.leaves.resize(c.windows);
  for (auto& s : c.leaves) CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  c.forks.resize(c.windows);
  c.joins.resize(c.windows);
  for (auto& f : c.forks) CK(cudaEventCreateWithFlags(&f, cudaEventDisableTiming));
  for (auto& f : c.joins) CK(cudaEventCreateWithFlags(&f, cudaEventDisableTiming));
  CK(cudaEventCreateWithFlags(&c.join, cudaEventDisableTiming));
  cudaEvent_t t0, t1;
  CK(cudaEventCreate(&t0));
  CK(cudaEventCreate(&t1));
  // Between chains: 256 MiB written then read back, so that L2 holds clean lines of its own.
  size_t flush_bytes = (size_t)256 << 20;
  uint4* flush;
  CK(cudaMalloc(&flush, flush_bytes));

  std::vector<Topo> topos;
  for (int t = 0; t < TOPOS; ++t)
    if (t != HAND || c.prefetch) topos.push_back((Topo)t);
  cudaGraphExec_t graphs[TOPOS];
  size_t nodes[TOPOS];
  for (Topo t : topos) {
    cudaGraph_t g;
    CK(cudaStreamBeginCapture(c.main, cudaStreamCaptureModeThreadLocal));
    c.enqueue(t);
    CK(cudaStreamEndCapture(c.main, &g));
    CK(cudaGraphGetNodes(g, nullptr, &nodes[t]));
    unsigned long long flags = (t == CHAIN_PRIO || t == CHAIN_NP) ? cudaGraphInstantiateFlagUseNodePriority : 0;
    CK(cudaGraphInstantiateWithFlags(&graphs[t], g, flags));
    CK(cudaGraphUpload(graphs[t], c.main));
    CK(cudaGraphDestroy(g));
  }
  std::vector<double> ms[2][TOPOS], lag_c[2][TOPOS], lag_r[2][TOPOS], rd[2][TOPOS], br_s[2][TOPOS],
      br_e[2][TOPOS];
  for (int r = 0; r < reps + 2; ++r) {
    for (int graph = 0; graph < 2; ++graph) {
      for (Topo t : topos) {
        CK(cudaMemsetAsync(flush, r & 0xFF, flush_bytes, c.main));
        reader<<<c.sms * 4, 256, 0, c.main>>>(flush, flush_bytes / 16, c.out, nullptr);
        CK(cudaMemcpyAsync(c.st, init.data(), init.size() * 8, cudaMemcpyHostToDevice, c.main));
        spin<<<1, 32, 0, c.main>>>(300000, nullptr);  // the host gets ahead of the chain
        CK(cudaEventRecord(t0, c.main));
        if (graph)
          CK(cudaGraphLaunch(graphs[t], c.main));
        else
          c.enqueue(t);
        CK(cudaEventRecord(t1, c.main));
        CK(cudaEventSynchronize(t1));
        float elapsed;
        CK(cudaEventElapsedTime(&elapsed, t0, t1));
        CK(cudaMemcpy(host.data(), c.st, host.size() * 8, cudaMemcpyDeviceToHost));
        double lc = 0, lr = 0, us = 0, bs = 0, be = 0;
        int branched = 0;
        for (int k = 0; k < c.windows; ++k) {
          const unsigned long long* h = &host[STAMPS * k];
          lc += ((double)h[2] - (double)h[1]) / 1e3;
          lr += ((double)h[6] - (double)h[3]) / 1e3;
          us += ((double)h[7] - (double)h[6]) / 1e3;
          if (h[5]) {
            bs += ((double)h[4] - (double)h[2]) / 1e3;
            be += ((double)h[5] - (double)h[3]) / 1e3;
            ++branched;
          }
        }
        if (r >= 2) {
          ms[graph][t].push_back(elapsed);
          lag_c[graph][t].push_back(lc / c.windows);
          lag_r[graph][t].push_back(lr / c.windows);
          rd[graph][t].push_back(us / c.windows);
          br_s[graph][t].push_back(branched ? bs / branched : 0);
          br_e[graph][t].push_back(branched ? be / branched : 0);
        }
      }
    }
  }
  printf("%s branch, %d windows: spin %.0f us, collective %.0f us, reader %zu MiB%s; %d reps\n",
         c.prefetch ? "prefetch" : "empty", c.windows, c.spin_ns / 1e3, c.coll_ns / 1e3,
         c.weight_bytes >> 20, c.prefetch ? ", 12 MiB warmed" : "", reps);
  for (int graph = 0; graph < 2; ++graph) {
    double none = median(ms[graph][NONE]);
    for (Topo t : topos) {
      double m = median(ms[graph][t]);
      printf("%s %-11s nodes %4zu  chain %.4f ms, %+.3f us a window against none; collective "
             "starts %.2f us after its spin, reader %.2f us after its collective; reader %.2f us; "
             "branch %+.2f us from the collective's start, ends %+.2f us from its end\n",
             graph ? "graph" : "eager", NAMES[t], nodes[t], m, (m - none) * 1e3 / c.windows,
             median(lag_c[graph][t]), median(lag_r[graph][t]), median(rd[graph][t]),
             median(br_s[graph][t]), median(br_e[graph][t]));
    }
  }
  return 0;
}
