/* fetchahead: side-stream prefetch of Engram rows, for inference engines.
 *
 * Link against libfetchahead.so (cargo build --release: target/release/libfetchahead.so).
 *
 * Every call returns FETCHAHEAD_OK (0) or an error code; fetchahead_last_error() gives the
 * calling thread's message. Nothing unwinds or aborts across this boundary.
 *
 * Streams are the caller's raw CUstream / cudaStream_t (torch.cuda.current_stream().cuda_stream),
 * device pointers the caller's (tensor.data_ptr()). The prefetcher uses the device's primary
 * context, the one the CUDA runtime (and PyTorch) uses. fetchahead_prefetch and
 * fetchahead_gather_dequant allocate nothing and can be captured into a CUDA graph (call
 * fetchahead_prefetcher_warm before the capture); every replay looks up the ids of that replay.
 *
 * Per step, per Engram layer:
 *   fetchahead_prefetch(p, ids, n, stream);      right after the hasher wrote ids
 *   ... the layers before this one run on stream ...
 *   fetchahead_gather_dequant(p, out, stream);   out: [n, dim] bf16
 * and once after the step's last gather (the default FETCHAHEAD_JOIN_TAGS):
 *   fetchahead_prefetcher_finish(p, stream);
 */
#ifndef FETCHAHEAD_H
#define FETCHAHEAD_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum {
    FETCHAHEAD_OK = 0,
    FETCHAHEAD_ERR_INVALID = 1,      /* a bad argument: null, misaligned, out of range */
    FETCHAHEAD_ERR_CUDA = 2,         /* a CUDA call failed, no PTX runs on the device, or a
                                        kernel needs a newer arch than the PTX loaded */
    FETCHAHEAD_ERR_NO_DEVICE = 3,
    FETCHAHEAD_ERR_LOOKUP = 4,       /* a row lookup failed (its rows were zero-filled) */
    FETCHAHEAD_ERR_NOT_WARMED = 5,   /* first use inside a graph capture: warm first */
    FETCHAHEAD_ERR_ORDER = 6,        /* gather without prefetch, or two prefetches in a row */
    FETCHAHEAD_ERR_STAGING_FULL = 7, /* more ids than the prefetcher's capacity */
    FETCHAHEAD_ERR_PANIC = 8         /* a bug in fetchahead; the call did nothing further */
};

typedef void *fetchahead_stream; /* a CUstream / cudaStream_t; NULL is the legacy stream */

typedef struct fetchahead_table fetchahead_table;
typedef struct fetchahead_prefetcher fetchahead_prefetcher;
typedef struct fetchahead_flag_lane fetchahead_flag_lane;

/* The calling thread's last error message, NUL-terminated into buf (len bytes, truncated);
 * returns the message's full length. Every call that returns a status (and fetchahead_lookup)
 * clears it when it succeeds: after a success the message is "" (length 0). A NUL inside a
 * message (from a file name) is written as the two characters \0. */
size_t fetchahead_last_error(char *buf, size_t len);

/* The library's version (Cargo's, the wheel's too), static. */
const char *fetchahead_version(void);

/* What the library was built as, a static JSON object: {"version", "git_commit", "archs" (the
 * embedded PTX), "features" (the crate's, on in this build), "target"}. */
const char *fetchahead_build_info(void);

/* ---- tables ---------------------------------------------------------------------------- */

/* A table of `rows` (at least 1) MXFP8 rows of `dim` elements (a multiple of 32 from 32 to 8192,
 * the row store's limits) generated in RAM from `seed`:
 * FP8-E4M3 weights (never NaN) and E8M0 scales in 120..134. Deterministic per seed. A table
 * larger than the memory available fails with FETCHAHEAD_ERR_INVALID (never an abort). */
int fetchahead_open_memory_table(uint64_t rows, uint32_t dim, uint64_t seed, fetchahead_table **out);

/* One Engram layer of an on-disk table (a model directory with model.safetensors.index.json, or
 * one .safetensors file): rows row_start .. row_start + num_rows (num_rows 0: every row from
 * row_start), read by the row store with its defaults (read path chosen by `fetchahead tune`,
 * scales resident in DRAM, O_DIRECT where allowed, no DRAM row cache; the FETCHAHEAD_* variables
 * override them, with the bounds every entry point has, and a value out of bounds fails here
 * with a message naming the variable). Lookups of ids outside
 * those rows fail with FETCHAHEAD_ERR_LOOKUP; a malformed table fails here with
 * FETCHAHEAD_ERR_INVALID and a message naming the file and tensor: so do a FIFO or device in
 * place of a shard, index or tune file (refused without blocking), layers of different row
 * counts, and sizes claimed by a header that do not fit the memory available. So does a table
 * whose rewrite by fetchahead did not finish (its fetchahead-table.json says "writing"; the
 * message gives the command that finishes it). The default read path never maps the files (no
 * SIGBUS when a shard is truncated under a running engine). */
int fetchahead_open_store(const char *dir, uint32_t layer, uint64_t row_start, uint64_t num_rows,
                          fetchahead_table **out);

enum {
    FETCHAHEAD_FAULT_NONE = 0,         /* disarm every fault */
    FETCHAHEAD_FAULT_FAIL_ON_ID = 1,   /* arg: a row id (-1 disarms); lookups including it fail */
    FETCHAHEAD_FAULT_FAIL_NEXT = 2,    /* arg: the next `arg` lookups fail */
    FETCHAHEAD_FAULT_CORRUPT_NEXT = 3, /* arg: the next `arg` lookups return one wrong byte */
    FETCHAHEAD_FAULT_LATENCY_US = 4    /* arg: each lookup first sleeps `arg` microseconds */
};

/* Fault injection, in-memory tables only. */
int fetchahead_table_inject(const fetchahead_table *table, uint32_t fault, int64_t arg);

/* Elements per row (0 for NULL). */
uint32_t fetchahead_table_dim(const fetchahead_table *table);

/* The last failure of fetchahead_lookup on this table, as fetchahead_last_error. */
size_t fetchahead_table_lookup_error(const fetchahead_table *table, char *buf, size_t len);

/* Prefetchers keep the table's rows alive; a fetchahead_work naming it must not run after this. */
void fetchahead_table_close(fetchahead_table *table);

/* ---- the host-function entry, for engines that enqueue lookups themselves ------------------- */

typedef struct fetchahead_work {
    const fetchahead_table *table;
    const int64_t *ids; /* host memory, count ids */
    uint8_t *weights;   /* host memory, count * dim bytes (FP8-E4M3), in the order of ids */
    uint8_t *scales;    /* host memory, count * dim / 32 bytes (E8M0) */
    uint64_t count;
    int32_t status;     /* written: FETCHAHEAD_OK, or an error code with the rows zero-filled */
} fetchahead_work;

/* cudaLaunchHostFunc(stream, fetchahead_lookup, &work): makes no CUDA call, never unwinds. On
 * failure (a NULL table or buffer included) it writes the status and leaves its message both for
 * fetchahead_last_error on the calling thread and for fetchahead_table_lookup_error. */
void fetchahead_lookup(void *work);

/* ---- prefetchers, one per Engram layer -------------------------------------------------- */

typedef struct fetchahead_prefetcher_config {
    uint64_t capacity;          /* most ids per prefetch (rounded up to a power of two) */
    const char *variant;        /* gather + dequant variant by name (`fetchahead kernels`);
                                 * NULL: the fastest measured for the device's arch */
    uint32_t check;             /* nonzero: check mode (synchronous path after each gather) */
    uint32_t fallback_on_error; /* nonzero: after a lookup error, gather synchronously */
    uint32_t completion;        /* FETCHAHEAD_COMPLETION_* */
    uint32_t check_log_ms;      /* check mode: the count's log period in ms (0: 10000) */
    uint32_t join;              /* FETCHAHEAD_JOIN_* (0, a zeroed config: AT_GATHER) */
} fetchahead_prefetcher_config;

/* The recommended configuration (the Rust PrefetcherConfig::default(), Python's and the demo's):
 * capacity 4096, variant NULL (the arch's fastest measured gather + dequant variant),
 * FETCHAHEAD_COMPLETION_FLAG and FETCHAHEAD_JOIN_TAGS (the measured best), fallback on, check
 * mode off. */
int fetchahead_prefetcher_config_default(fetchahead_prefetcher_config *out);

enum {
    /* Each gather makes `stream` wait for its prefetch's side stream (an event). */
    FETCHAHEAD_JOIN_AT_GATHER = 0,
    /* Each gather waits on the device for its rows' tags; `stream` joins the side stream at
     * fetchahead_prefetcher_finish, once after the step's last gather (a graph capture cannot
     * end without it). In a replayed decode step it stalled 0.6-1.5% of the lookup time
     * against 3.7-6.2% joined at each gather (H200). */
    FETCHAHEAD_JOIN_TAGS = 1
};

enum {
    /* The lookup runs in a host function, on the driver's one callback thread (all streams). */
    FETCHAHEAD_COMPLETION_HOST_FUNCTION = 0,
    /* The lookup runs on a lookup thread of the library's (the device's default lane, shared by
     * the prefetchers made with fetchahead_prefetcher_create, or a fetchahead_flag_lane); the
     * side stream waits on a pinned flag (cuStreamWaitValue32). */
    FETCHAHEAD_COMPLETION_FLAG = 1
};

int fetchahead_prefetcher_create(const fetchahead_table *table, int32_t device,
                                 const fetchahead_prefetcher_config *config,
                                 fetchahead_prefetcher **out);

/* A lookup thread that flag-mode prefetchers share: one lookup at a time, in the order the
 * prefetches were enqueued (enqueue the layers in gather order), so that a later layer's
 * lookup never shares the disk with, nor runs ahead of, the one needed first. Measured on an
 * H200 it hides lookups better than host functions (about 0.04 ms a prefetch against 0.2 ms). */
int fetchahead_flag_lane_create(fetchahead_flag_lane **out);

/* A flag-mode prefetcher (config->completion == FETCHAHEAD_COMPLETION_FLAG) on `lane`; `rank`
 * orders requests that wait together (the layer's gather order). */
int fetchahead_prefetcher_create_in_lane(const fetchahead_table *table, int32_t device,
                                         const fetchahead_prefetcher_config *config,
                                         const fetchahead_flag_lane *lane, uint32_t rank,
                                         fetchahead_prefetcher **out);

/* Releases the caller's hold on the lane; its thread stops once its prefetchers are closed. */
void fetchahead_flag_lane_close(fetchahead_flag_lane *lane);

/* First use of every buffer and kernel, eagerly; call before capturing a graph. */
int fetchahead_prefetcher_warm(fetchahead_prefetcher *p);

/* The side stream waits for `stream`, copies the `count` int64 device ids, looks them up in a
 * host function and copies the rows to the device. `ids` must stay unchanged until the gather. */
int fetchahead_prefetch(fetchahead_prefetcher *p, const int64_t *ids, uint64_t count,
                        fetchahead_stream stream);

/* out[i] = bf16 of row ids[i] (count * dim bf16, 16-byte aligned), after `stream` waits for the
 * side stream (FETCHAHEAD_JOIN_AT_GATHER) or for each row's tag on the device (JOIN_TAGS). In
 * check mode the synchronous path then runs and the outputs are compared. */
int fetchahead_gather_dequant(fetchahead_prefetcher *p, uint16_t *out, fetchahead_stream stream);

/* FETCHAHEAD_JOIN_TAGS: `stream` waits for the side stream's work of the last prefetch; once
 * after the step's last gather, and before a capture ends. Nothing to do with JOIN_AT_GATHER. */
int fetchahead_prefetcher_finish(fetchahead_prefetcher *p, fetchahead_stream stream);

/* FETCHAHEAD_JOIN_TAGS: *late = rows the gathers since the last call gave up on after the tag
 * timeout (1 s; gathered as zeros, and logged). Waits for the device. */
int fetchahead_late_rows(fetchahead_prefetcher *p, uint32_t *late);

/* The synchronous path: lookup and gather all on `stream`. */
int fetchahead_gather_dequant_sync(fetchahead_prefetcher *p, const int64_t *ids, uint64_t count,
                                   uint16_t *out, fetchahead_stream stream);

typedef struct fetchahead_counters {
    uint64_t prefetches;     /* calls (a graph replay adds none) */
    uint64_t gathers;        /* prefetched gathers enqueued */
    uint64_t sync_gathers;   /* synchronous-path gathers enqueued (check mode and fallback too) */
    uint64_t lookups;        /* lookups run, graph replays included */
    uint64_t rows_looked_up;
    uint64_t lookup_errors;
    uint32_t fell_back;      /* nonzero while gathers take the synchronous path */
    int32_t check_differed;  /* check mode: gathers that differed (expected 0); -1 when off */
} fetchahead_counters;

/* Waits for the device when check mode is on (not capturable). */
int fetchahead_read_counters(fetchahead_prefetcher *p, fetchahead_counters *out);

/* Check mode's periodic log without waiting, for callers that replay graphs (eager gathers
 * poll it themselves): *differed = the count of a snapshot that has arrived (also logged), or
 * -1; enqueues the next snapshot on `stream` every 10 s. Does nothing during a capture. */
int fetchahead_poll_check(fetchahead_prefetcher *p, fetchahead_stream stream, int32_t *differed);

#define FETCHAHEAD_MESSAGE_BYTES 256

typedef struct fetchahead_lookup_error {
    uint64_t id_count;   /* ids the failed lookup was asked for */
    uint64_t ids_offset; /* where its ids start in ids_out */
    uint64_t ids_copied; /* how many of them fitted */
    char message[FETCHAHEAD_MESSAGE_BYTES];
} fetchahead_lookup_error;

/* Takes the kept failures (up to 16 between calls, oldest first): up to `cap` records into
 * `errors`, their ids concatenated into `ids_out` (`ids_cap` ids), the number taken into *taken. */
int fetchahead_take_errors(fetchahead_prefetcher *p, fetchahead_lookup_error *errors, uint32_t cap,
                           int64_t *ids_out, uint64_t ids_cap, uint32_t *taken);

/* Back to prefetching after a fallback. */
int fetchahead_prefetcher_resume(fetchahead_prefetcher *p);

/* Waits for the device, then frees. Graphs that captured `p` must be destroyed first. */
void fetchahead_prefetcher_close(fetchahead_prefetcher *p);

/* ---- L2 plan: warms the weights after each collective into L2 while it runs ------------ */

typedef struct fetchahead_l2_plan fetchahead_l2_plan;

enum { /* what a forward did to its signature's plan */
    FETCHAHEAD_LEARNED_NEW = 0,
    FETCHAHEAD_LEARNED_REPLACED = 1,
    FETCHAHEAD_LEARNED_UNCHANGED = 2,
    FETCHAHEAD_LEARNED_NO_COLLECTIVES = 3,
    FETCHAHEAD_LEARNED_FROZEN = 4,
    FETCHAHEAD_LEARNED_CAPTURED = 5,
    FETCHAHEAD_LEARNED_CAPTURED_MISMATCH = 6
};

typedef struct fetchahead_l2_forward_summary {
    uint64_t signature;
    uint64_t collectives;
    uint32_t captured;      /* nonzero: the forward was captured into a graph */
    uint32_t learned;       /* FETCHAHEAD_LEARNED_* */
    uint32_t new_signature; /* nonzero: this forward stored its signature's first plan */
    uint32_t _reserved;
} fetchahead_l2_forward_summary;

typedef struct fetchahead_l2_counters {
    uint64_t windows_prefetched;   /* windows issued from the host (a capture counts once) */
    uint64_t bytes_prefetched;
    uint64_t forwards_without_plan;
    uint64_t mismatches_at_capture;
    uint64_t forwards;
    uint64_t signatures;
    uint64_t windows_host_bound;   /* eager windows left cold: the GPU had caught up with the host */
} fetchahead_l2_counters;

/* A plan on `device` (its primary context), budget_per_window bytes a window at most (0: half of L2,
 * each window then cut to what its prefetch issues within it).
 * Creates its side stream: call before any capture. Per forward:
 *   fetchahead_l2_plan_begin_forward(plan, signature, stream);  the stream may be capturing
 *   for each collective: fetchahead_l2_plan_collective(plan); launch it on stream;
 *       fetchahead_l2_plan_consume(plan, weight, bytes) for each weight read after it
 *   fetchahead_l2_plan_end_forward(plan, &summary);            summary may be NULL
 * A captured signature is frozen; its tables live as long as the plan. */
int fetchahead_l2_plan_create(int32_t device, fetchahead_stream stream, uint64_t budget_per_window,
                              fetchahead_l2_plan **out);
/* As fetchahead_l2_plan_create, each window warmed by the replay named `replay`: "auto" (or
 * NULL: reads windows up to half of L2, bulk-prefetches larger ones), "access_policy", or an
 * L2 prefetch variant ("l2_prefetch", "l2_prefetch_evict_last", "l2_prefetch_lines",
 * "l2_prefetch_loads"). An unknown name fails with FETCHAHEAD_ERR_INVALID, its message listing
 * the names. */
int fetchahead_l2_plan_create_with_replay(int32_t device, fetchahead_stream stream,
                                          uint64_t budget_per_window, const char *replay,
                                          fetchahead_l2_plan **out);
int fetchahead_l2_plan_begin_forward(fetchahead_l2_plan *plan, uint64_t signature,
                                     fetchahead_stream stream);
int fetchahead_l2_plan_collective(fetchahead_l2_plan *plan);
/* As fetchahead_l2_plan_collective, naming the collective's kind: 0 all-reduce, 1 all-gather,
 * 2 other. With all-gather windows off (fetchahead_l2_plan_set_all_gather(plan, 0), or
 * FETCHAHEAD_L2_ALL_GATHER=0 at create) an all-gather's window is counted, not warmed. */
int fetchahead_l2_plan_collective_kind(fetchahead_l2_plan *plan, uint32_t kind);
int fetchahead_l2_plan_set_all_gather(fetchahead_l2_plan *plan, int enabled);
/* Eager forwards only: nonzero (the default, or FETCHAHEAD_L2_HOST_PACE=1 at create) leaves a
 * window cold while the GPU keeps up with the host, since its prefetch could not shorten the
 * forward and its launch would lengthen it (counted in windows_host_bound); 0 always warms. */
int fetchahead_l2_plan_set_host_pace(fetchahead_l2_plan *plan, int enabled);
/* Bytes a window may warm at most, for plans learned from now on. */
int fetchahead_l2_plan_set_budget(fetchahead_l2_plan *plan, uint64_t budget_per_window);
int fetchahead_l2_plan_consume(fetchahead_l2_plan *plan, uint64_t address, uint64_t bytes);
int fetchahead_l2_plan_end_forward(fetchahead_l2_plan *plan, fetchahead_l2_forward_summary *out);
int fetchahead_l2_plan_counters(fetchahead_l2_plan *plan, fetchahead_l2_counters *out);
/* Graphs that captured the plan's forwards must be destroyed first. */
void fetchahead_l2_plan_close(fetchahead_l2_plan *plan);

/* The layouts the library was built with (checked on the Rust side too). */
#ifdef __cplusplus
static_assert(sizeof(fetchahead_work) == 48, "fetchahead_work layout");
static_assert(sizeof(fetchahead_prefetcher_config) == 40, "fetchahead_prefetcher_config layout");
static_assert(sizeof(fetchahead_counters) == 56, "fetchahead_counters layout");
static_assert(sizeof(fetchahead_lookup_error) == 24 + FETCHAHEAD_MESSAGE_BYTES, "fetchahead_lookup_error layout");
static_assert(sizeof(fetchahead_l2_forward_summary) == 32, "fetchahead_l2_forward_summary layout");
static_assert(sizeof(fetchahead_l2_counters) == 56, "fetchahead_l2_counters layout");
}
#else
_Static_assert(sizeof(fetchahead_work) == 48, "fetchahead_work layout");
_Static_assert(sizeof(fetchahead_prefetcher_config) == 40, "fetchahead_prefetcher_config layout");
_Static_assert(sizeof(fetchahead_counters) == 56, "fetchahead_counters layout");
_Static_assert(sizeof(fetchahead_lookup_error) == 24 + FETCHAHEAD_MESSAGE_BYTES, "fetchahead_lookup_error layout");
_Static_assert(sizeof(fetchahead_l2_forward_summary) == 32, "fetchahead_l2_forward_summary layout");
_Static_assert(sizeof(fetchahead_l2_counters) == 56, "fetchahead_l2_counters layout");
#endif

#endif /* FETCHAHEAD_H */
