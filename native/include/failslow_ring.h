/*
 * failslow_ring.h -- the shared-memory ring between the native collectors and the node agent.
 *
 * One header, included by every producer (NCCL interposer, NCCL profiler plugin, verbs shim)
 * and by the C consumer in ring.c. The Python reader (failslow.collectors.ring) mirrors the
 * two structures below with numpy structured dtypes; tests/test_native_ring.py compares the
 * offsets printed by a C program with those dtypes, so any change here must be made there too
 * and must bump FS_RING_VERSION.
 *
 * File
 *   One file per process and collector: $FAILSLOW_RING_DIR/failslow-<job>-<pid>-<collector>.ring
 *   (default directory /dev/shm). A 512-byte header followed by `capacity` records of 128 bytes,
 *   capacity a power of two. The producer maps it MAP_SHARED | MAP_POPULATE; the agent maps the
 *   same file. The directory must be on tmpfs: on a disk file system the kernel write-protects
 *   shared file pages for dirty tracking, and the first write to each page after writeback takes
 *   a fault (measured: ~30 ns per record on tmpfs, 85-490 ns on ext4).
 *
 * Indices
 *   write_idx and read_idx count records since creation (they never wrap; slot = idx & (cap-1)).
 *   write_idx - read_idx is the number of reserved-but-unconsumed records (<= capacity).
 *
 * Producer protocol (any number of threads in the process; lock-free, never blocks)
 *   1. w = write_idx (relaxed); r = read_idx (acquire).
 *   2. If w - r >= capacity the ring is full: dropped += 1 (relaxed) and return. Training is
 *      never slowed down by a slow or absent consumer.
 *   3. CAS write_idx: w -> w + 1 (on failure retry from 2 with the fresh w).
 *   4. Fill slot w & (cap-1), every field except `commit`.
 *   5. Store commit = w + 1 with release order. This publishes the record.
 *   Choice: a CAS reservation plus a per-slot commit word (rather than one ring per thread),
 *   because NCCL is entered from several threads of one process (the Python main thread, the
 *   NCCL proxy thread, CUDA's host-callback thread, the verbs sampler) and the agent should see
 *   one file per process and collector. The reservation is one uncontended CAS (~5-20 ns).
 *   A thread preempted between steps 3 and 5 only delays the consumer (it stops at the first
 *   uncommitted slot); it never blocks other producers.
 *
 * Consumer protocol (one consumer per file: the agent)
 *   r = read_idx; while slot(r).commit == r + 1 (acquire): copy the record, r += 1.
 *   Then store read_idx = r (release). The commit word names the lap, so stale records of a
 *   previous lap (commit = r + 1 - capacity) are never mistaken for new ones and slots need
 *   no clearing. The C consumer in ring.c uses acquire loads of the commit words.
 *
 * Code without C11 atomics (the Python reader and writer, numpy over the mapped file) follows
 *   the same protocol with fences between plain accesses:
 *     consumer: load commit words; fs_fence_acquire(); copy payloads; fs_fence_release();
 *               store read_idx;
 *     producer: load read_idx; fs_fence_acquire(); store payloads; fs_fence_release();
 *               store commit words.
 *   On x86-64 (TSO: loads are not reordered with loads, stores not with stores, stores not
 *   before earlier loads) these fences are compiler barriers only, which an opaque call into
 *   numpy already is, so the Python side skips them there; elsewhere (aarch64) it calls the
 *   two exported functions of libfailslow_ring.so and refuses to run without them.
 *
 * Hot path: no lock, no allocation, no system call. Times come from clock_gettime
 *   (CLOCK_REALTIME), which on x86-64 Linux is served by the vDSO from user space when the
 *   clocksource is tsc (check /sys/devices/system/clocksource/clocksource0/current_clocksource;
 *   with xen/hpet/acpi_pm it falls back to a real system call). The benchmark
 *   (failslow bench collector) counts system calls per intercepted call with strace.
 *
 * Control word: written by the agent at any time, read (relaxed) by producers on every event.
 *   FS_CTL_PAUSE   record nothing (calls pass straight through).
 *   FS_CTL_DETAIL  also record the optional detail kinds (progress rows, per-queue-pair link
 *                  samples, group markers, network-plugin events).
 *
 * Fork: the child of a fork must not write into its parent's ring. ring.c registers a
 *   pthread_atfork child handler that unmaps the inherited ring; the child creates its own
 *   ring (with its own pid in the name) the next time it records something.
 */
#ifndef FAILSLOW_RING_H
#define FAILSLOW_RING_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#ifndef CLOCK_REALTIME
#error "failslow_ring.h needs clock_gettime: define _GNU_SOURCE (or _POSIX_C_SOURCE >= 199309L) before including any system header"
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define FS_RING_MAGIC 0x31474e4952534c46ULL /* "FLSRING1" little-endian */
#define FS_RING_VERSION 1u
#define FS_HEADER_SIZE 512u
#define FS_RECORD_SIZE 128u
#define FS_DEFAULT_CAPACITY 65536u
#define FS_MIN_CAPACITY 64u
#define FS_MAX_CAPACITY (1u << 26)

/* Sentinels: identical to failslow.events NULL_TIME / NULL_COUNT. */
#define FS_NULL_TIME INT64_MIN
#define FS_NULL_COUNT UINT64_MAX

/* Record kinds. */
enum fs_kind {
  FS_KIND_NONE = 0,
  FS_KIND_COLL = 1,     /* collective / point-to-point row (phase enter or end) -> `coll` */
  FS_KIND_PROGRESS = 2, /* steps executed so far by an in-flight operation -> `progress` */
  FS_KIND_LINK = 3,     /* RDMA work-request counters of a NIC or queue pair -> `link` */
  FS_KIND_COMM = 4,     /* communicator created (phase 0) or destroyed/aborted (phase 1) */
  FS_KIND_GROUP = 5,    /* detail: ncclGroupStart (phase 0) / ncclGroupEnd (phase 1) */
};

/* Operation codes: the index in failslow.events.COLL_OPS. */
enum fs_op {
  FS_OP_ALLREDUCE = 0,
  FS_OP_ALLGATHER = 1,
  FS_OP_REDUCESCATTER = 2,
  FS_OP_BROADCAST = 3,
  FS_OP_REDUCE = 4,
  FS_OP_ALLTOALL = 5,
  FS_OP_SEND = 6,
  FS_OP_RECV = 7,
  FS_OP_UNKNOWN = 255, /* an operation outside the contract (gather, scatter, ...) */
};

enum fs_phase { FS_PHASE_ENTER = 0, FS_PHASE_END = 1 };

/* Which collector wrote the ring (header.collector and record.source). */
enum fs_source {
  FS_SRC_UNKNOWN = 0,
  FS_SRC_INTERPOSER = 1, /* LD_PRELOAD NCCL API interposer */
  FS_SRC_PROFILER = 2,   /* NCCL profiler plugin */
  FS_SRC_VERBS = 3,      /* RDMA verbs shim */
  FS_SRC_TEST = 4,       /* test drivers and the Python writer */
};

/* record.flags */
#define FS_FLAG_ENTER_AT_LAUNCH 0x01u /* enter time is the kernel-launch time, not the API call */
#define FS_FLAG_INFERRED_END 0x02u    /* end inferred: a later operation of the comm completed */
#define FS_FLAG_LOCAL_COMM 0x04u      /* comm id not derived from a shared id (not comparable) */
#define FS_FLAG_GRAPH 0x08u           /* operation recorded during CUDA graph capture */
#define FS_FLAG_ERROR 0x10u           /* the NCCL call returned an error; no device work */
#define FS_FLAG_UNTRACKED 0x20u       /* completion not tracked (pool full): end time = enter */
#define FS_FLAG_NONBLOCKING 0x40u     /* NCCL returned ncclInProgress (non-blocking comm) */
#define FS_FLAG_EARLY_END 0x80u       /* completion callback queued before the group launch */
#define FS_FLAG_QP 0x100u             /* link sample of one queue pair (else: whole device) */
#define FS_FLAG_ABORT 0x200u          /* comm record: ncclCommAbort */

/* header.control */
#define FS_CTL_PAUSE 0x1u
#define FS_CTL_DETAIL 0x2u

/* header.caps: what the writer of this ring is able to report. */
#define FS_CAP_END_ROWS 0x1u  /* `end` rows are emitted: a missing end means in flight */
#define FS_CAP_T_START 0x2u   /* end rows carry t_start */
#define FS_CAP_COUNTS 0x4u    /* end rows carry send/recv counts */
#define FS_CAP_LINK 0x8u      /* link samples are emitted */

/*
 * One record, 128 bytes. Field use per kind (unused fields are 0, or the NULL sentinels):
 *
 *  kind      COLL                 PROGRESS         LINK                      COMM
 *  op        fs_op                fs_op            -                         -
 *  phase     enter/end            -                -                         0 init / 1 destroy
 *  rank      global rank (-1: unknown, the reader fills in the header rank)
 *  comm_rank comm rank            comm rank        -                         comm rank
 *  comm_size nranks               nranks           -                         nranks
 *  peer      send/recv peer,      -                -                         -
 *            bcast/reduce root,
 *            else -1
 *  device    CUDA device or -1    -                NIC index in this process CUDA device or -1
 *  comm      communicator id      comm id          -                         comm id
 *  seq       per-comm op counter  in-flight seq    -                         parent comm id (split)
 *  bytes     count x dtype size   -                completed bytes (cum.)    -
 *  t_ns      enter: API call;     sample time      sample time               event time
 *            end: completion
 *  t_start_ns end: transfer start (or NULL)        -                         -
 *  send_count end: send steps (or NULL)  steps so far  posted bytes (cum.)   -
 *  recv_count end: recv steps (or NULL)  steps so far  recv completions      -
 *  posted    -                    -                WRs posted (cum.)         -
 *  completed -                    -                WRs completed (cum.)      -
 *  qp_num    -                    -                queue pair (FS_FLAG_QP)   -
 *  name      -                    -                NIC name, e.g. mlx5_0     communicator name
 */
struct fs_record {
  _Atomic uint64_t commit; /*   0: index + 1 once published (see the producer protocol) */
  uint8_t kind;            /*   8: enum fs_kind */
  uint8_t op;              /*   9: enum fs_op */
  uint8_t phase;           /*  10: enum fs_phase */
  uint8_t source;          /*  11: enum fs_source */
  int32_t rank;            /*  12 */
  int32_t comm_rank;       /*  16 */
  int32_t comm_size;       /*  20 */
  int32_t peer;            /*  24 */
  int32_t device;          /*  28 */
  uint64_t comm;           /*  32 */
  uint64_t seq;            /*  40 */
  uint64_t bytes;          /*  48 */
  int64_t t_ns;            /*  56 */
  int64_t t_start_ns;      /*  64 */
  uint64_t send_count;     /*  72 */
  uint64_t recv_count;     /*  80 */
  uint64_t posted;         /*  88 */
  uint64_t completed;      /*  96 */
  uint32_t flags;          /* 104: FS_FLAG_* */
  uint32_t qp_num;         /* 108 */
  char name[16];           /* 112: NUL-terminated unless all 16 bytes are used */
};                         /* 128 */

/* The ring header, 512 bytes. Hot, independently written words live on separate cache lines. */
struct fs_ring_header {
  _Atomic uint64_t magic;       /*   0: FS_RING_MAGIC, stored last at creation (release) */
  uint32_t version;             /*   8: FS_RING_VERSION */
  uint32_t header_size;         /*  12: FS_HEADER_SIZE */
  uint32_t record_size;         /*  16: FS_RECORD_SIZE */
  uint32_t collector;           /*  20: enum fs_source */
  uint64_t capacity;            /*  24: records, a power of two */
  int32_t pid;                  /*  32 */
  int32_t rank;                 /*  36: global rank from the environment, -1 if unknown */
  int32_t local_rank;           /*  40 */
  int32_t world_size;           /*  44 */
  int64_t created_ns;           /*  48 */
  char job[72];                 /*  56: FAILSLOW_JOB (1-64 chars of [A-Za-z0-9._-]) */
  char host[64];                /* 128: gethostname() */
  _Atomic uint64_t write_idx;   /* 192 */
  uint8_t pad0[56];             /* 200 */
  _Atomic uint64_t read_idx;    /* 256 */
  uint8_t pad1[56];             /* 264 */
  _Atomic uint64_t dropped;     /* 320: records lost because the ring was full */
  _Atomic uint64_t pool_dropped;/* 328: events lost because a collector's fixed pool was full */
  _Atomic uint32_t control;     /* 336: FS_CTL_* (agent -> producers) */
  _Atomic uint32_t closed;      /* 340: 1 once the producer process unmapped the ring at exit */
  uint32_t caps;                /* 344: FS_CAP_* */
  uint32_t reserved0;           /* 348 */
  _Atomic uint64_t heartbeat_ns;/* 352: last time a producer-side sampler ran (0: none) */
  uint8_t pad2[152];            /* 360 .. 512 */
};

#if defined(__STDC_VERSION__) && __STDC_VERSION__ >= 201112L
_Static_assert(sizeof(struct fs_record) == FS_RECORD_SIZE, "fs_record must be 128 bytes");
_Static_assert(sizeof(struct fs_ring_header) == FS_HEADER_SIZE, "fs_ring_header must be 512 bytes");
_Static_assert(offsetof(struct fs_record, name) == 112, "fs_record layout");
_Static_assert(offsetof(struct fs_ring_header, write_idx) == 192, "header layout");
_Static_assert(offsetof(struct fs_ring_header, read_idx) == 256, "header layout");
_Static_assert(offsetof(struct fs_ring_header, dropped) == 320, "header layout");
#endif

/* A mapped ring (process-local handle; the shared state is all in the file). */
struct fs_ring {
  struct fs_ring_header *hdr;
  struct fs_record *rec;
  uint64_t capacity;
  uint64_t mask;
  size_t map_size;
};

/* Creation parameters. Zeroed fields take defaults (see ring.c). */
struct fs_ring_meta {
  const char *job;
  int32_t rank;
  int32_t local_rank;
  int32_t world_size;
  uint32_t collector;
  uint32_t control;
  uint32_t caps;
};

#ifndef FS_API
#define FS_API
#endif

/* ---- ring.c: creation, attachment, consumption (not on any hot path) ---- */

/* Create (truncate) the file `path` holding a ring of `capacity` records (rounded up to a power
 * of two) and map it. Returns 0 or -errno. */
FS_API int fs_ring_create(struct fs_ring *ring, const char *path, uint64_t capacity,
                          const struct fs_ring_meta *meta);
/* Map an existing ring file (consumer side). Returns 0 or -errno (-EPROTO: bad magic/layout). */
FS_API int fs_ring_attach(struct fs_ring *ring, const char *path);
/* Unmap. */
FS_API void fs_ring_detach(struct fs_ring *ring);
/* Consumer: copy up to `max` published records in order into `out`, release their slots and
 * return how many were copied. Single consumer per ring. */
FS_API size_t fs_ring_drain(struct fs_ring *ring, struct fs_record *out, size_t max);
/* Set / read the control word. */
FS_API void fs_ring_set_control(struct fs_ring *ring, uint32_t control);
FS_API uint32_t fs_ring_control(const struct fs_ring *ring);

/* ---- process rings: one per collector library and process, created lazily from the env ---- */

struct fs_proc_ring {
  _Atomic(struct fs_ring *) ring; /* NULL until created */
  _Atomic int state;              /* 0 none, 1 creating, 2 ready, 3 failed */
  uint32_t collector;             /* enum fs_source */
  uint32_t caps;
  const char *tag;                /* file-name suffix, e.g. "nccl" */
  struct fs_ring storage;
};

/* Create the process ring if needed (reads FAILSLOW_* variables; a few system calls, once per
 * process and collector). Returns NULL while another thread creates it or if creation failed. */
FS_API struct fs_ring *fs_proc_ring_slow(struct fs_proc_ring *p);
/* Mark the ring closed and unmap it (library destructor). */
FS_API void fs_proc_ring_close(struct fs_proc_ring *p);
/* Global rank / job from the environment (FAILSLOW_RANK, RANK, OMPI_COMM_WORLD_RANK, ...). */
FS_API int32_t fs_env_rank(void);
FS_API int fs_env_flag(const char *name, int dflt);
FS_API long long fs_env_ll(const char *name, long long dflt);

/* Acquire / release fences (atomic_thread_fence) for consumers and producers that access the
 * ring with plain loads and stores: see "Code without C11 atomics" above. */
FS_API void fs_fence_acquire(void);
FS_API void fs_fence_release(void);

/* ---- helpers shared by the collector libraries (ring.c; none on a hot path) ---- */

/* The power of two at least `v`, with `v` clamped to [lo, hi] (lo, hi powers of two). */
FS_API uint64_t fs_pow2_clamp(uint64_t v, uint64_t lo, uint64_t hi);
/* fs_pow2_clamp of the integer variable `name` (`dflt` when unset, invalid or <= 0). */
FS_API uint64_t fs_env_pow2(const char *name, uint64_t dflt, uint64_t lo, uint64_t hi);
/* The integer variable `name` (else `dflt`) in `unit_ns` nanoseconds: a period such as
 * FAILSLOW_LINK_PERIOD_MS; <= 0 means "off". */
FS_API int64_t fs_env_ns(const char *name, long long dflt, int64_t unit_ns);
/* The first of the libraries ${env_name} and then `names` (NULL-terminated) that the process
 * has already loaded (dlopen RTLD_NOLOAD: a collector never loads a library itself), or NULL. */
FS_API void *fs_dlopen_loaded(const char *env_name, const char *const *names);
/* Run `fn` in the child after fork() (besides forgetting the parent's process rings); the
 * same `fn` registered twice runs once. Returns 0, or -1 when the table is full. */
FS_API int fs_atfork_child(void (*fn)(void));
/* Start `fn(arg)` on a detached thread. Returns 0 or an errno value. */
FS_API int fs_start_detached(void *(*fn)(void *), void *arg);

/* Short forms used by the collector sources. */
#define FS_EXPORT __attribute__((visibility("default")))
#define FS_LIKELY(x) __builtin_expect(!!(x), 1)
#define FS_UNLIKELY(x) __builtin_expect(!!(x), 0)
#define FS_RLX memory_order_relaxed
#define FS_ACQ memory_order_acquire
#define FS_REL memory_order_release
#define FS_AR memory_order_acq_rel

/* ---- inline hot path ---- */

static inline int64_t fs_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts); /* vDSO: no system call with the tsc clocksource */
  return (int64_t)ts.tv_sec * 1000000000LL + (int64_t)ts.tv_nsec;
}

static inline struct fs_ring *fs_proc_ring_get(struct fs_proc_ring *p) {
  struct fs_ring *r = atomic_load_explicit(&p->ring, memory_order_acquire);
  if (__builtin_expect(r != NULL, 1)) return r;
  return fs_proc_ring_slow(p);
}

static inline uint32_t fs_ring_ctl(const struct fs_ring *r) {
  return atomic_load_explicit(&((struct fs_ring_header *)r->hdr)->control, memory_order_relaxed);
}

/* Reserve one slot; NULL (and dropped += 1) when the ring is full. */
static inline struct fs_record *fs_ring_reserve(struct fs_ring *r, uint64_t *idx) {
  struct fs_ring_header *h = r->hdr;
  uint64_t w = atomic_load_explicit(&h->write_idx, memory_order_relaxed);
  for (;;) {
    uint64_t rd = atomic_load_explicit(&h->read_idx, memory_order_acquire);
    if (__builtin_expect(w - rd >= r->capacity, 0)) {
      atomic_fetch_add_explicit(&h->dropped, 1, memory_order_relaxed);
      return NULL;
    }
    if (atomic_compare_exchange_weak_explicit(&h->write_idx, &w, w + 1, memory_order_relaxed,
                                              memory_order_relaxed))
      break;
  }
  *idx = w;
  /* Warm the next slot for writing: with calls microseconds apart (NCCL) its cache misses are
   * taken now, off the next call's path. */
  struct fs_record *next = &r->rec[(w + 1) & r->mask];
  __builtin_prefetch(next, 1, 3);
  __builtin_prefetch((char *)next + 64, 1, 3);
  return &r->rec[w & r->mask];
}

/* Publish a reserved slot. */
static inline void fs_ring_commit(struct fs_ring *r, struct fs_record *rec, uint64_t idx) {
  (void)r;
  atomic_store_explicit(&rec->commit, idx + 1, memory_order_release);
}

/* Copy a filled record (its commit field is ignored) into the ring. Returns 0, or -1 if dropped. */
static inline int fs_ring_put(struct fs_ring *r, const struct fs_record *src) {
  uint64_t idx;
  struct fs_record *dst = fs_ring_reserve(r, &idx);
  if (!dst) return -1;
  /* field-wise copy after the commit word (which is written last, with release order) */
  __builtin_memcpy((char *)dst + sizeof(uint64_t), (const char *)src + sizeof(uint64_t),
                   sizeof(struct fs_record) - sizeof(uint64_t));
  fs_ring_commit(r, dst, idx);
  return 0;
}

/* A communicator record (FS_KIND_COMM: created, split, destroyed) with the fields every
 * collector fills alike; the caller adds its own (device, parent, flags, name). */
static inline void fs_comm_record(struct fs_record *rec, uint8_t phase, uint8_t source,
                                  int32_t rank, int32_t comm_rank, int32_t comm_size,
                                  uint64_t comm, int64_t t, int64_t t_start) {
  __builtin_memset(rec, 0, sizeof(*rec));
  rec->kind = FS_KIND_COMM;
  rec->phase = phase;
  rec->op = FS_OP_UNKNOWN;
  rec->source = source;
  rec->rank = rank;
  rec->comm_rank = comm_rank;
  rec->comm_size = comm_size;
  rec->peer = -1;
  rec->comm = comm;
  rec->t_ns = t;
  rec->t_start_ns = t_start;
  rec->send_count = FS_NULL_COUNT;
  rec->recv_count = FS_NULL_COUNT;
}

static inline void fs_pool_dropped(struct fs_ring *r) {
  atomic_fetch_add_explicit(&r->hdr->pool_dropped, 1, memory_order_relaxed);
}

#ifdef __cplusplus
}
#endif
#endif /* FAILSLOW_RING_H */
