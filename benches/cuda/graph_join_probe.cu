// A CUDA C++ probe, not part of the build: what a prefetch side branch costs the main chain of a
// decode step, eagerly and replayed from a CUDA graph, by the parts of the branch. It mirrors
// the Engram prefetcher's flag mode: per Engram layer, after the hash the side stream copies the
// ids to pinned memory, publishes a request word (cuStreamWriteValue32), waits for a host thread
// to set a done word (cuStreamWaitValue32), re-arms it, copies the staged rows to the device;
// the main stream waits for that (an event) before the layer's gather.
// On the GPU machine:
//   nvcc -O3 -arch=sm_90 -std=c++17 benches/cuda/graph_join_probe.cu -lcuda -o /tmp/gj && /tmp/gj
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#define CK(x)                                                                       \
  do {                                                                              \
    cudaError_t e = (x);                                                            \
    if (e) {                                                                        \
      printf("err %s line %d\n", cudaGetErrorString(e), __LINE__);                  \
      exit(1);                                                                      \
    }                                                                               \
  } while (0)
#define CU(x)                                                                       \
  do {                                                                              \
    CUresult e = (x);                                                               \
    if (e) {                                                                        \
      const char* s;                                                                \
      cuGetErrorString(e, &s);                                                      \
      printf("err %s line %d\n", s, __LINE__);                                      \
      exit(1);                                                                      \
    }                                                                               \
  } while (0)

__global__ void spin(uint64_t ns) {
  uint64_t t0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  for (;;) {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    if (t - t0 >= ns) break;
  }
}

// A weight-bound reader: sums `n` uint4 into one word per block.
__global__ void reader(const uint4* __restrict__ w, uint64_t n, uint32_t* out) {
  uint32_t acc = 0;
  for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n;
       i += (uint64_t)gridDim.x * blockDim.x) {
    uint4 v = w[i];
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x12345678u) out[blockIdx.x] = acc;
}

__global__ void hash(int64_t* ids, int n, uint32_t seed) {
  for (int i = threadIdx.x; i < n; i += blockDim.x) ids[i] = (int64_t)((i * 2654435761u) ^ seed) % 100000;
}

// The layer's gather: `n` rows of 64 uint4 from `src` to `dst`. With `flag`, the block first
// waits for *flag == 1 (written after the row copies by the side stream), and the last block
// re-arms it.
__global__ void gather(const uint4* src, uint4* dst, int n, volatile uint32_t* flag, uint32_t* arrived,
                       int rearm) {
  if (flag) {
    if (threadIdx.x == 0)
      while (*flag != 1) {
      }
    __syncthreads();
    __threadfence();
  }
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n * 64; i += gridDim.x * blockDim.x) dst[i] = src[i];
  if (flag && rearm) {
    __syncthreads();
    if (threadIdx.x == 0) {
      __threadfence();
      if (atomicAdd(arrived, 1) == gridDim.x - 1) {
        *arrived = 0;
        *flag = 0;
        if (rearm == 2) __threadfence_system();
      }
    }
  }
}

__global__ void nothing() {}

__global__ void copy(const uint4* src, uint4* dst, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) dst[i] = src[i];
}

enum Branch {
  NONE,       // no side branch: rows resident
  EMPTY,      // fork, an empty kernel, join
  COPIES,     // fork, ids D2H, rows H2D, join
  MEMOPS,     // fork, write request, wait done, re-arm, join (host thread answers)
  FULL,       // the prefetcher's branch: ids D2H, memops, rows H2D, join
  FULL_LATE,  // the same branch, joined only at the end of the step
  FULL_FLAG,  // the same branch plus a device flag the gather polls; joined at the end
  FULL_WAIT,  // the same branch plus a device flag the main stream waits on (memops); joined at the end
  FULL_POLL_LIGHT,  // as FULL_FLAG, the gather's last block re-arming without a system fence
  FULL_POLL_MEMOP,  // as FULL_FLAG, the main stream re-arming the flag with a memop after the gather
  FULL_KTAIL,  // the full branch ending in an empty kernel, joined before the gather
  FULL_KCOPY,  // the full branch with the row copies done by a kernel, joined before the gather
  FULL_EXTEV,  // the full branch; the gather waits on an external event node; joined at the end
  COUNT
};
const char* NAMES[] = {"none (rows resident)", "fork + empty kernel + join", "fork + copies + join",
                       "fork + memops + join", "fork + full branch + join",
                       "full branch, joined at the end", "full branch, gather polls a flag, joined at end",
                       "full branch, main waits a flag (memop), joined at end",
                       "as poll, re-armed without a system fence", "as poll, re-armed by a memop on main",
                       "full branch + an empty kernel at its end + join", "full branch, rows copied by a kernel, + join",
                       "full branch, external event record/wait, joined at end"};

struct Layer {
  int64_t* ids;       // device
  int64_t* ids_host;  // pinned
  uint4* staged_host; // pinned
  uint4* staged;      // device
  uint4* out;
  uint32_t* words;    // pinned [request, done]
  CUdeviceptr words_dev;
  uint32_t* ready;    // device flag for FULL_FLAG
  uint32_t* arrived;
};

const int ROWS = 72 * 4;  // 72 tokens x 4 heads? the crate's decode: tokens x heads ids
const int LAYERS = 61, WINDOWS_PER_LAYER = 2, ENGRAM[2] = {2, 15};

struct Step {
  cudaStream_t main, side;
  cudaEvent_t fork[2], join[2], ext[2];
  Layer layer[2];
  uint4* weights;
  uint64_t weight_n;
  uint32_t* sink;
  int sms;

  void enqueue(Branch b) {
    cudaStreamCaptureStatus cs;
    CK(cudaStreamIsCapturing(main, &cs));
    bool captured = cs == cudaStreamCaptureStatusActive;
    for (int k = 0; k < 2; k++) {
      hash<<<1, 256, 0, main>>>(layer[k].ids, ROWS, 17 + k);
      if (b == NONE) continue;
      CK(cudaEventRecord(fork[k], main));
      CK(cudaStreamWaitEvent(side, fork[k], 0));
      Layer& L = layer[k];
      if (b == EMPTY) nothing<<<1, 32, 0, side>>>();
      if (b == COPIES || b >= FULL)
        CK(cudaMemcpyAsync(L.ids_host, L.ids, 8 * ROWS, cudaMemcpyDeviceToHost, side));
      if (b == MEMOPS || b >= FULL) {
        CU(cuStreamWriteValue32((CUstream)side, L.words_dev, ROWS + 1, 0));
        CU(cuStreamWaitValue32((CUstream)side, L.words_dev + 4, 1, CU_STREAM_WAIT_VALUE_EQ));
        CU(cuStreamWriteValue32((CUstream)side, L.words_dev + 4, 0, 0));
      }
      if (b == FULL_KCOPY) {
        copy<<<8, 256, 0, side>>>(L.staged_host, L.staged, 64 * ROWS + ROWS / 2);
      } else if (b == COPIES || b >= FULL) {
        CK(cudaMemcpyAsync(L.staged, L.staged_host, 64 * 16 * ROWS, cudaMemcpyHostToDevice, side));
        CK(cudaMemcpyAsync(L.staged + 64 * ROWS, L.staged_host + 64 * ROWS, 8 * ROWS, cudaMemcpyHostToDevice, side));
      }
      if (b == FULL_KTAIL) nothing<<<1, 32, 0, side>>>();
      if (b >= FULL_FLAG && b <= FULL_POLL_MEMOP) CU(cuStreamWriteValue32((CUstream)side, (CUdeviceptr)L.ready, 1, 0));
      if (b == FULL_EXTEV) CK(captured ? cudaEventRecordWithFlags(ext[k], side, cudaEventRecordExternal) : cudaEventRecord(ext[k], side));
      CK(cudaEventRecord(join[k], side));
    }
    uint64_t off = 0, per = weight_n / (LAYERS * WINDOWS_PER_LAYER * 3);
    for (int l = 1; l <= LAYERS; l++) {
      for (int w = 0; w < WINDOWS_PER_LAYER; w++) {
        spin<<<sms, 128, 0, main>>>(150000);   // compute
        spin<<<4, 128, 0, main>>>(25000);      // collective
        for (int r = 0; r < 3; r++) {
          reader<<<sms * 4, 256, 0, main>>>(weights + off, per, sink);
          off += per;
        }
      }
      for (int k = 0; k < 2; k++) {
        if (ENGRAM[k] != l) continue;
        Layer& L = layer[k];
        if (b != NONE && (b < FULL_LATE || b >= FULL_KTAIL)) CK(cudaStreamWaitEvent(main, join[k], 0));
        if (b == FULL_EXTEV) CK(cudaStreamWaitEvent(main, ext[k], captured ? cudaEventWaitExternal : 0));
        if (b == FULL_WAIT) {
          CU(cuStreamWaitValue32((CUstream)main, (CUdeviceptr)L.ready, 1, CU_STREAM_WAIT_VALUE_EQ));
          CU(cuStreamWriteValue32((CUstream)main, (CUdeviceptr)L.ready, 0, 0));
        }
        bool flag = b == FULL_FLAG || b == FULL_POLL_LIGHT || b == FULL_POLL_MEMOP;
        int rearm = b == FULL_FLAG ? 2 : b == FULL_POLL_LIGHT ? 1 : 0;
        gather<<<2, 256, 0, main>>>(L.staged, L.out, ROWS, flag ? L.ready : nullptr, L.arrived, rearm);
        if (b == FULL_POLL_MEMOP) CU(cuStreamWriteValue32((CUstream)main, (CUdeviceptr)L.ready, 0, 0));
      }
    }
    if ((b >= FULL_LATE && b <= FULL_POLL_MEMOP) || b == FULL_EXTEV)
      for (int k = 0; k < 2; k++) CK(cudaStreamWaitEvent(main, join[k], 0));
  }
};

std::atomic<bool> stop{false};

void answer(Layer* layers) {
  // The lookup thread: sees each request, "looks up" (nothing), sets done.
  while (!stop.load(std::memory_order_relaxed)) {
    for (int k = 0; k < 2; k++) {
      uint32_t* w = layers[k].words;
      if (__atomic_load_n(&w[0], __ATOMIC_ACQUIRE) != 0) {
        __atomic_store_n(&w[0], 0, __ATOMIC_RELAXED);
        __atomic_store_n(&w[1], 1, __ATOMIC_RELEASE);
      }
    }
  }
}

int main() {
  CK(cudaSetDevice(0));
  cudaDeviceProp p;
  CK(cudaGetDeviceProperties(&p, 0));
  Step s{};
  s.sms = p.multiProcessorCount;
  CK(cudaStreamCreateWithFlags(&s.main, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&s.side, cudaStreamNonBlocking));
  for (int k = 0; k < 2; k++) {
    CK(cudaEventCreateWithFlags(&s.fork[k], cudaEventDisableTiming));
    CK(cudaEventCreateWithFlags(&s.join[k], cudaEventDisableTiming));
    CK(cudaEventCreateWithFlags(&s.ext[k], cudaEventDisableTiming));
    Layer& L = s.layer[k];
    CK(cudaMalloc(&L.ids, 8 * ROWS));
    CK(cudaHostAlloc(&L.ids_host, 8 * ROWS, cudaHostAllocDefault));
    CK(cudaHostAlloc(&L.staged_host, 64 * 16 * ROWS + 8 * ROWS, cudaHostAllocWriteCombined));
    CK(cudaMalloc(&L.staged, 64 * 16 * ROWS + 8 * ROWS));
    CK(cudaMalloc(&L.out, 64 * 16 * ROWS));
    CK(cudaHostAlloc(&L.words, 8, cudaHostAllocMapped));
    memset(L.words, 0, 8);
    CK(cudaHostGetDevicePointer((void**)&L.words_dev, L.words, 0));
    CK(cudaMalloc(&L.ready, 4));
    CK(cudaMalloc(&L.arrived, 4));
    CK(cudaMemset(L.ready, 0, 4));
    CK(cudaMemset(L.arrived, 0, 4));
  }
  s.weight_n = (3ull << 30) / 16;  // 3 GiB of weights, far beyond L2
  CK(cudaMalloc(&s.weights, s.weight_n * 16));
  CK(cudaMemset(s.weights, 1, s.weight_n * 16));
  CK(cudaMalloc(&s.sink, 4 * 4096));
  std::thread t(answer, s.layer);
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  const int REPS = 80;
  double eager[COUNT][REPS], graph[COUNT][REPS];
  cudaGraphExec_t exec[COUNT];
  for (int b = 0; b < COUNT; b++) {
    cudaGraph_t g;
    CK(cudaStreamBeginCapture(s.main, cudaStreamCaptureModeThreadLocal));
    s.enqueue((Branch)b);
    CK(cudaStreamEndCapture(s.main, &g));
    CK(cudaGraphInstantiate(&exec[b], g, 0));
    CK(cudaGraphUpload(exec[b], s.main));
    size_t nodes;
    CK(cudaGraphGetNodes(g, nullptr, &nodes));
    printf("%-48s graph nodes %zu\n", NAMES[b], nodes);
  }
  // Interleaved: each rep runs every configuration once, eager then graph.
  for (int r = -3; r < REPS; r++) {
    for (int b = 0; b < COUNT; b++) {
      for (int mode = 0; mode < 2; mode++) {
        spin<<<1, 32, 0, s.main>>>(8000000);  // lead-in: the CPU enqueues the whole step meanwhile
        CK(cudaEventRecord(e0, s.main));
        if (mode == 0)
          s.enqueue((Branch)b);
        else
          CK(cudaGraphLaunch(exec[b], s.main));
        CK(cudaEventRecord(e1, s.main));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        if (r >= 0) (mode ? graph : eager)[b][r] = ms * 1000.0;
      }
    }
  }
  stop = true;
  t.join();
  auto median = [](double* v) {
    std::vector<double> x(v, v + REPS);
    std::sort(x.begin(), x.end());
    return x[REPS / 2];
  };
  // Paired: each rep's step minus the same rep's step without a branch, then the median.
  auto paired = [&](double (*t)[REPS], int b) {
    std::vector<double> x(REPS);
    for (int i = 0; i < REPS; i++) x[i] = t[b][i] - t[NONE][i];
    std::sort(x.begin(), x.end());
    return x[REPS / 2];
  };
  printf("\n%-54s %10s %14s %10s %14s\n", "branch (2 Engram layers)", "eager us", "- none, paired",
         "graph us", "- none, paired");
  for (int b = 0; b < COUNT; b++)
    printf("%-54s %10.1f %14.2f %10.1f %14.2f\n", NAMES[b], median(eager[b]), paired(eager, b), median(graph[b]),
           paired(graph, b));
  return 0;
}
