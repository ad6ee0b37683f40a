/*
 * interposer.c -- LD_PRELOAD interposer of the NCCL host API (MegaTrace §III-B-1 "API
 * interception"; CCL-D §5.1 Trace ID = (communicator id, per-communicator op counter)).
 *
 * Every intercepted collective / point-to-point call writes an `enter` row (host time of the
 * call, op, bytes = count x datatype size, peer/root, comm id, comm rank/size, seq) before it
 * forwards to the real NCCL (found with dlsym(RTLD_NEXT) or, when libnccl was loaded
 * RTLD_LOCAL, through dlopen(RTLD_NOLOAD)). Completion is observed host-driven (CCL-D §5.2):
 * a CUDA host function queued on the operation's stream right after it (cudaLaunchHostFunc,
 * resolved at run time; cuLaunchHostFunc of libcuda as fallback) writes the `end` row when the
 * stream reaches it. Calls inside ncclGroupStart/End queue their host function only after the
 * outermost ncclGroupEnd has launched the group's kernels, one callback per stream.
 *
 * Communicator identity (the same value on every member): a 64-bit hash of the ncclUniqueId
 * for ncclCommInitRank[Config|Scalable]; for ncclCommSplit a hash of (parent id, color, number
 * of earlier splits of the parent) -- every member calls split in the same order. Comms seen
 * without an intercepted init get a process-local id and FS_FLAG_LOCAL_COMM.
 *
 * Hot path (a collective outside graph capture): one lock-free hash lookup, one relaxed
 * fetch-add (seq), clock_gettime via vDSO, one ring reservation (CAS) and a 128-byte store;
 * with completion tracking also a fixed-pool slot (CAS) and the CUDA host-function call.
 * No lock, allocation or system call of ours.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "failslow_ring.h"
#include "nccl_abi.h"

#define TLS __thread __attribute__((tls_model("initial-exec")))

static struct fs_proc_ring g_ring = {.collector = FS_SRC_INTERPOSER, .tag = "nccl"};
static int32_t g_rank = -1;

/* ------------------------------------------------------------------------------------------ */
/* resolution of the real NCCL */

static void *nccl_handle(void) {
  static _Atomic(void *) handle;
  void *h = atomic_load_explicit(&handle, memory_order_acquire);
  if (h) return h;
  static const char *const names[] = {"libnccl.so.2", "libnccl.so", NULL};
  h = fs_dlopen_loaded("FAILSLOW_NCCL_LIB", names);
  if (h) atomic_store_explicit(&handle, h, memory_order_release);
  return h;
}

static void *resolve(const char *name, void *self) {
  void *f = dlsym(RTLD_NEXT, name);
  if (!f || f == self) {
    void *h = nccl_handle();
    f = h ? dlsym(h, name) : NULL;
  }
  return f == self ? NULL : f;
}

#define REAL(name, type)                                                         \
  static _Atomic(void *) real_##name##_p;                                        \
  static inline type real_##name(void) {                                         \
    void *f = atomic_load_explicit(&real_##name##_p, memory_order_acquire);      \
    if (FS_UNLIKELY(!f)) {                                                          \
      f = resolve(#name, (void *)&name);                                         \
      atomic_store_explicit(&real_##name##_p, f, memory_order_release);          \
    }                                                                            \
    return (type)f;                                                              \
  }

/* helpers that are not interposed */
static fs_nccl_comm_int_t plain_fn(const char *name) {
  void *f = dlsym(RTLD_NEXT, name);
  if (!f) {
    void *h = nccl_handle();
    f = h ? dlsym(h, name) : NULL;
  }
  return (fs_nccl_comm_int_t)f;
}

static int comm_query(const char *name, ncclComm_t comm, int dflt) {
  fs_nccl_comm_int_t f = plain_fn(name);
  int v = dflt;
  if (!f || !comm || f(comm, &v) != ncclSuccess) return dflt;
  return v;
}

/* ------------------------------------------------------------------------------------------ */
/* CUDA completion hooks, resolved once at the first communicator init */

static _Atomic(fs_launch_host_func_t) g_hostfn;
static _Atomic(fs_stream_is_capturing_t) g_capturing;
static pthread_once_t g_setup_once = PTHREAD_ONCE_INIT;

static void *cuda_sym(const char *rt_name, const char *drv_name) {
  void *f = dlsym(RTLD_DEFAULT, rt_name);
  if (f) return f;
  static const char *const rt[] = {"libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0",
                                   "libcudart.so", NULL};
  static const char *const drv[] = {"libcuda.so.1", NULL};
  void *h = fs_dlopen_loaded("FAILSLOW_CUDART_LIB", rt);
  if (h) f = dlsym(h, rt_name);
  if (!f && (h = fs_dlopen_loaded(NULL, drv)) != NULL)
    f = dlsym(h, drv_name); /* driver API: same argument shapes, CUstream == cudaStream_t */
  return f;
}

static void setup(void) {
  const char *mode = getenv("FAILSLOW_COMPLETION");
  if (!mode || strcmp(mode, "off") != 0) {
    void *hf = cuda_sym("cudaLaunchHostFunc", "cuLaunchHostFunc");
    void *cap = cuda_sym("cudaStreamIsCapturing", "cuStreamIsCapturing");
    atomic_store_explicit(&g_capturing, (fs_stream_is_capturing_t)cap, memory_order_release);
    atomic_store_explicit(&g_hostfn, (fs_launch_host_func_t)hf, memory_order_release);
  }
  g_ring.caps = atomic_load_explicit(&g_hostfn, memory_order_acquire) ? FS_CAP_END_ROWS : 0u;
  struct fs_ring *r = fs_proc_ring_get(&g_ring);
  if (r) __atomic_store_n(&r->hdr->caps, g_ring.caps, __ATOMIC_RELEASE);
}

static inline void ensure_setup(void) { pthread_once(&g_setup_once, setup); }

/* ------------------------------------------------------------------------------------------ */
/* communicator table: open addressing keyed by the ncclComm_t pointer; lock-free lookups,
 * inserts and removals (communicator init/destroy only) under a mutex. */

#define COMM_SLOTS 4096u
#define COMM_TOMB ((uintptr_t)1)

struct comm_state {
  uint64_t id;
  int32_t comm_rank;
  int32_t comm_size;
  int32_t device;
  uint32_t flags;
  _Atomic uint64_t seq;
  _Atomic uint64_t splits;
};

static _Atomic uintptr_t g_comm_keys[COMM_SLOTS];
static struct comm_state g_comms[COMM_SLOTS];
static pthread_mutex_t g_comm_mu = PTHREAD_MUTEX_INITIALIZER;
static _Atomic uint64_t g_local_ids;

/* fork() while another thread inserts or removes a communicator would leave g_comm_mu
 * locked for good in the child: it is held across fork(), as glibc holds its malloc
 * locks. Nothing forks while it holds g_comm_mu. */
static pthread_once_t g_fork_lock_once = PTHREAD_ONCE_INIT;
static void lock_for_fork(void) { pthread_mutex_lock(&g_comm_mu); }
static void unlock_after_fork(void) { pthread_mutex_unlock(&g_comm_mu); }
static void register_fork_lock(void) {
  pthread_atfork(lock_for_fork, unlock_after_fork, unlock_after_fork);
}

static inline uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

static uint64_t hash_bytes(const void *p, size_t n, uint64_t seed) {
  const unsigned char *b = (const unsigned char *)p;
  uint64_t h = mix64(seed ^ 0x243f6a8885a308d3ULL);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    memcpy(&w, b + i, 8);
    h = mix64(h ^ w);
  }
  uint64_t tail = 0;
  if (i < n) memcpy(&tail, b + i, n - i);
  return mix64(h ^ tail ^ ((uint64_t)n << 56));
}

static inline uint32_t ptr_slot(uintptr_t p) {
  return (uint32_t)(((uint64_t)(p >> 4) * 0x9E3779B97F4A7C15ULL) >> 52) & (COMM_SLOTS - 1);
}

static inline struct comm_state *comm_find(ncclComm_t comm) {
  uintptr_t key = (uintptr_t)comm;
  uint32_t i = ptr_slot(key);
  for (uint32_t n = 0; n < COMM_SLOTS; n++, i = (i + 1) & (COMM_SLOTS - 1)) {
    uintptr_t k = atomic_load_explicit(&g_comm_keys[i], memory_order_acquire);
    if (k == key) return &g_comms[i];
    if (k == 0) return NULL;
  }
  return NULL;
}

static struct comm_state *comm_insert(ncclComm_t comm, uint64_t id, int32_t crank, int32_t csize,
                                      int32_t device, uint32_t flags) {
  uintptr_t key = (uintptr_t)comm;
  if (key <= COMM_TOMB) return NULL;
  pthread_once(&g_fork_lock_once, register_fork_lock);
  pthread_mutex_lock(&g_comm_mu);
  uint32_t i = ptr_slot(key), free_slot = COMM_SLOTS;
  for (uint32_t n = 0; n < COMM_SLOTS; n++, i = (i + 1) & (COMM_SLOTS - 1)) {
    uintptr_t k = atomic_load_explicit(&g_comm_keys[i], memory_order_relaxed);
    if (k == key) {
      free_slot = i;
      break;
    }
    if (k == COMM_TOMB && free_slot == COMM_SLOTS) free_slot = i;
    if (k == 0) {
      if (free_slot == COMM_SLOTS) free_slot = i;
      break;
    }
  }
  struct comm_state *s = NULL;
  if (free_slot < COMM_SLOTS) {
    s = &g_comms[free_slot];
    s->id = id;
    s->comm_rank = crank;
    s->comm_size = csize;
    s->device = device;
    s->flags = flags;
    atomic_store_explicit(&s->seq, 0, memory_order_relaxed);
    atomic_store_explicit(&s->splits, 0, memory_order_relaxed);
    atomic_store_explicit(&g_comm_keys[free_slot], key, memory_order_release);
  }
  pthread_mutex_unlock(&g_comm_mu);
  return s;
}

static void comm_remove(ncclComm_t comm) {
  pthread_mutex_lock(&g_comm_mu);
  uintptr_t key = (uintptr_t)comm;
  uint32_t i = ptr_slot(key);
  for (uint32_t n = 0; n < COMM_SLOTS; n++, i = (i + 1) & (COMM_SLOTS - 1)) {
    uintptr_t k = atomic_load_explicit(&g_comm_keys[i], memory_order_relaxed);
    if (k == key) {
      atomic_store_explicit(&g_comm_keys[i], COMM_TOMB, memory_order_release);
      break;
    }
    if (k == 0) break;
  }
  pthread_mutex_unlock(&g_comm_mu);
}

static void write_comm_record(const struct comm_state *s, uint8_t phase, uint64_t parent,
                              int64_t t, int64_t t_start, uint32_t extra_flags) {
  struct fs_ring *r = fs_proc_ring_get(&g_ring);
  if (!r) return;
  struct fs_record rec;
  fs_comm_record(&rec, phase, FS_SRC_INTERPOSER, g_rank, s->comm_rank, s->comm_size, s->id, t,
                 t_start);
  rec.device = s->device;
  rec.seq = parent;
  rec.flags = s->flags | extra_flags;
  fs_ring_put(r, &rec);
}

static struct comm_state *register_comm(ncclComm_t comm, uint64_t id, int32_t crank,
                                        int32_t csize, uint64_t parent, uint32_t flags,
                                        int64_t t_start) {
  if (!comm) return NULL;
  int32_t dev = comm_query("ncclCommCuDevice", comm, -1);
  struct comm_state *s = comm_insert(comm, id, crank, csize, dev, flags);
  if (!s) {
    struct fs_ring *r = fs_proc_ring_get(&g_ring);
    if (r) fs_pool_dropped(r);
    return NULL;
  }
  write_comm_record(s, 0, parent, fs_now_ns(), t_start, 0);
  return s;
}

/* A communicator created through an API we do not intercept: process-local identity. */
static struct comm_state *comm_register_unknown(ncclComm_t comm) {
  if (!comm) return NULL;
  ensure_setup();
  uint64_t n = atomic_fetch_add_explicit(&g_local_ids, 1, memory_order_relaxed);
  uint64_t id = mix64(((uint64_t)getpid() << 32) ^ (uint64_t)(uintptr_t)comm ^ mix64(n + 1));
  int32_t crank = comm_query("ncclCommUserRank", comm, -1);
  int32_t csize = comm_query("ncclCommCount", comm, -1);
  return register_comm(comm, id, crank, csize, 0, FS_FLAG_LOCAL_COMM, FS_NULL_TIME);
}

static inline struct comm_state *comm_get(ncclComm_t comm) {
  struct comm_state *s = comm_find(comm);
  if (FS_LIKELY(s != NULL)) return s;
  return comm_register_unknown(comm);
}

/* ------------------------------------------------------------------------------------------ */
/* records */

static inline void write_coll(struct fs_ring *r, uint8_t phase, uint8_t op, uint64_t comm,
                              int32_t crank, int32_t csize, int32_t device, uint64_t seq,
                              uint64_t bytes, int32_t peer, int64_t t, uint32_t flags) {
  uint64_t idx;
  struct fs_record *d = fs_ring_reserve(r, &idx);
  if (FS_UNLIKELY(!d)) return;
  d->kind = FS_KIND_COLL;
  d->op = op;
  d->phase = phase;
  d->source = FS_SRC_INTERPOSER;
  d->rank = g_rank;
  d->comm_rank = crank;
  d->comm_size = csize;
  d->peer = peer;
  d->device = device;
  d->comm = comm;
  d->seq = seq;
  d->bytes = bytes;
  d->t_ns = t;
  d->t_start_ns = FS_NULL_TIME;
  d->send_count = FS_NULL_COUNT;
  d->recv_count = FS_NULL_COUNT;
  d->posted = 0;
  d->completed = 0;
  d->flags = flags;
  d->qp_num = 0;
  memset(d->name, 0, sizeof(d->name));
  fs_ring_commit(r, d, idx);
}

/* ------------------------------------------------------------------------------------------ */
/* pending completions: a fixed pool; a slot is taken with a CAS and freed by the callback */

#define PEND_SLOTS 8192u
#define PEND_PROBES 8u

struct pending {
  _Atomic uint32_t state; /* 0 free, 1 busy */
  uint32_t next;          /* chain: index + 1 of the next slot of the same callback, 0 = end */
  uint64_t comm, seq, bytes;
  int64_t t_enter;
  int32_t comm_rank, comm_size, peer, device;
  uint32_t flags;
  uint8_t op;
};

static struct pending g_pend[PEND_SLOTS];
static _Atomic uint32_t g_pend_cursor;

static inline int pend_alloc(void) {
  uint32_t c = atomic_fetch_add_explicit(&g_pend_cursor, 1, memory_order_relaxed);
  for (uint32_t k = 0; k < PEND_PROBES; k++) {
    uint32_t i = (c + k) & (PEND_SLOTS - 1);
    uint32_t expected = 0;
    if (atomic_compare_exchange_strong_explicit(&g_pend[i].state, &expected, 1,
                                                memory_order_acquire, memory_order_relaxed))
      return (int)i;
  }
  return -1;
}

/* Write the end rows of a chain and free its slots. t < 0: use each slot's enter time. */
static void complete_chain(uint32_t i, int64_t t, uint32_t extra) {
  struct fs_ring *r = fs_proc_ring_get(&g_ring);
  for (;;) {
    struct pending *p = &g_pend[i];
    uint32_t next = p->next;
    if (r)
      write_coll(r, FS_PHASE_END, p->op, p->comm, p->comm_rank, p->comm_size, p->device, p->seq,
                 p->bytes, p->peer, t < 0 ? p->t_enter : t, p->flags | extra);
    p->next = 0;
    atomic_store_explicit(&p->state, 0, memory_order_release);
    if (!next) break;
    i = next - 1;
  }
}

/* CUDA host function: the stream reached the point after the operation(s). */
static void on_complete(void *arg) { complete_chain((uint32_t)(uintptr_t)arg - 1, fs_now_ns(), 0); }

static void launch_chain(uint32_t head, cudaStream_t stream) {
  fs_launch_host_func_t hf = atomic_load_explicit(&g_hostfn, memory_order_acquire);
  if (!hf || hf(stream, on_complete, (void *)(uintptr_t)(head + 1)) != 0)
    complete_chain(head, -1, FS_FLAG_UNTRACKED);
}

/* per-thread group state */
#define GROUP_STREAMS 8
struct group_stream {
  cudaStream_t stream;
  uint32_t head, tail;
};
static TLS int t_depth;
static TLS int t_ngroup;
static TLS struct group_stream t_group[GROUP_STREAMS];

static void defer_or_launch(uint32_t i, cudaStream_t stream) {
  if (t_depth <= 0) {
    launch_chain(i, stream);
    return;
  }
  for (int k = 0; k < t_ngroup; k++) {
    if (t_group[k].stream == stream) {
      g_pend[t_group[k].tail].next = i + 1;
      t_group[k].tail = i;
      return;
    }
  }
  if (t_ngroup < GROUP_STREAMS) {
    t_group[t_ngroup].stream = stream;
    t_group[t_ngroup].head = t_group[t_ngroup].tail = i;
    t_ngroup++;
    return;
  }
  g_pend[i].flags |= FS_FLAG_EARLY_END; /* too many streams in one group */
  launch_chain(i, stream);
}

/* ------------------------------------------------------------------------------------------ */
/* the common call path */

struct call {
  struct fs_ring *ring;
  struct comm_state *cs;
  cudaStream_t stream;
  uint64_t seq, bytes;
  int64_t t;
  int32_t peer;
  uint32_t flags;
  uint8_t op;
};

static const uint8_t k_dtype_size[ncclNumTypes] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};

static inline uint64_t dtype_size(ncclDataType_t dt) {
  return ((unsigned)dt < (unsigned)ncclNumTypes) ? k_dtype_size[dt] : 1u;
}

static inline int call_begin(struct call *c, ncclComm_t comm, cudaStream_t stream, uint8_t op,
                             uint64_t bytes, int32_t peer) {
  struct comm_state *cs = comm_get(comm);
  if (FS_UNLIKELY(!cs)) return 0;
  /* seq counts every call, recorded or not, so it stays aligned across ranks */
  uint64_t seq = atomic_fetch_add_explicit(&cs->seq, 1, memory_order_relaxed);
  struct fs_ring *r = fs_proc_ring_get(&g_ring);
  if (FS_UNLIKELY(!r) || FS_UNLIKELY(fs_ring_ctl(r) & FS_CTL_PAUSE)) return 0;
  c->ring = r;
  c->cs = cs;
  c->stream = stream;
  c->seq = seq;
  c->bytes = bytes;
  c->peer = peer;
  c->op = op;
  c->flags = cs->flags;
  fs_stream_is_capturing_t cap = atomic_load_explicit(&g_capturing, memory_order_relaxed);
  if (cap && atomic_load_explicit(&g_hostfn, memory_order_relaxed)) {
    int status = 0;
    if (cap(stream, &status) == 0 && status != 0) c->flags |= FS_FLAG_GRAPH;
  }
  c->t = fs_now_ns();
  write_coll(r, FS_PHASE_ENTER, op, cs->id, cs->comm_rank, cs->comm_size, cs->device, seq, bytes,
             peer, c->t, c->flags);
  return 1;
}

static inline void call_end(struct call *c, ncclResult_t res) {
  struct comm_state *cs = c->cs;
  if (FS_UNLIKELY(res != ncclSuccess && res != ncclInProgress)) {
    write_coll(c->ring, FS_PHASE_END, c->op, cs->id, cs->comm_rank, cs->comm_size, cs->device,
               c->seq, c->bytes, c->peer, fs_now_ns(), c->flags | FS_FLAG_ERROR);
    return;
  }
  if (FS_UNLIKELY(c->flags & FS_FLAG_GRAPH)) { /* captured, not executed: close it at once */
    write_coll(c->ring, FS_PHASE_END, c->op, cs->id, cs->comm_rank, cs->comm_size, cs->device,
               c->seq, c->bytes, c->peer, fs_now_ns(), c->flags);
    return;
  }
  if (!atomic_load_explicit(&g_hostfn, memory_order_relaxed)) return; /* no completion tracking */
  uint32_t flags = c->flags | (res == ncclInProgress ? FS_FLAG_NONBLOCKING : 0u);
  int i = pend_alloc();
  if (FS_UNLIKELY(i < 0)) {
    fs_pool_dropped(c->ring);
    write_coll(c->ring, FS_PHASE_END, c->op, cs->id, cs->comm_rank, cs->comm_size, cs->device,
               c->seq, c->bytes, c->peer, c->t, flags | FS_FLAG_UNTRACKED);
    return;
  }
  struct pending *p = &g_pend[i];
  p->next = 0;
  p->comm = cs->id;
  p->seq = c->seq;
  p->bytes = c->bytes;
  p->t_enter = c->t;
  p->comm_rank = cs->comm_rank;
  p->comm_size = cs->comm_size;
  p->peer = c->peer;
  p->device = cs->device;
  p->flags = flags;
  p->op = c->op;
  defer_or_launch((uint32_t)i, c->stream);
}

#define INTERCEPT(op_code, bytes_expr, peer_expr, comm_arg, stream_arg, call_expr) \
  do {                                                                             \
    struct call c_;                                                                \
    int on_ = call_begin(&c_, (comm_arg), (stream_arg), (op_code), (bytes_expr),   \
                         (peer_expr));                                             \
    ncclResult_t res_ = (call_expr);                                               \
    if (on_) call_end(&c_, res_);                                                  \
    return res_;                                                                   \
  } while (0)

/* ------------------------------------------------------------------------------------------ */
/* communicator lifecycle */

FS_EXPORT ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank);
FS_EXPORT ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id,
                                           int rank, ncclConfig_t *config);
FS_EXPORT ncclResult_t ncclCommInitRankScalable(ncclComm_t *comm, int nranks, int myrank, int nId,
                                             ncclUniqueId *ids, ncclConfig_t *config);
FS_EXPORT ncclResult_t ncclCommInitAll(ncclComm_t *comms, int ndev, const int *devlist);
FS_EXPORT ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
                                  ncclConfig_t *config);
FS_EXPORT ncclResult_t ncclCommDestroy(ncclComm_t comm);
FS_EXPORT ncclResult_t ncclCommAbort(ncclComm_t comm);
FS_EXPORT ncclResult_t ncclGroupStart(void);
FS_EXPORT ncclResult_t ncclGroupEnd(void);
FS_EXPORT ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                                  ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                  cudaStream_t stream);
FS_EXPORT ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                                  ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);
FS_EXPORT ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                                      ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                      cudaStream_t stream);
FS_EXPORT ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count,
                                  ncclDataType_t datatype, int root, ncclComm_t comm,
                                  cudaStream_t stream);
FS_EXPORT ncclResult_t ncclBcast(void *buff, size_t count, ncclDataType_t datatype, int root,
                              ncclComm_t comm, cudaStream_t stream);
FS_EXPORT ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count,
                               ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm,
                               cudaStream_t stream);
FS_EXPORT ncclResult_t ncclAlltoAll(const void *sendbuff, void *recvbuff, size_t count,
                                 ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);
FS_EXPORT ncclResult_t ncclAllToAll(const void *sendbuff, void *recvbuff, size_t count,
                                 ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);
FS_EXPORT ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer,
                             ncclComm_t comm, cudaStream_t stream);
FS_EXPORT ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer,
                             ncclComm_t comm, cudaStream_t stream);

REAL(ncclCommInitRank, fs_nccl_init_rank_t)
REAL(ncclCommInitRankConfig, fs_nccl_init_rank_config_t)
REAL(ncclCommInitRankScalable, fs_nccl_init_rank_scalable_t)
REAL(ncclCommInitAll, fs_nccl_init_all_t)
REAL(ncclCommSplit, fs_nccl_split_t)
REAL(ncclCommDestroy, fs_nccl_comm_t)
REAL(ncclCommAbort, fs_nccl_comm_t)
REAL(ncclGroupStart, fs_nccl_void_t)
REAL(ncclGroupEnd, fs_nccl_void_t)
REAL(ncclAllReduce, fs_nccl_allreduce_t)
REAL(ncclAllGather, fs_nccl_allgather_t)
REAL(ncclReduceScatter, fs_nccl_reducescatter_t)
REAL(ncclBroadcast, fs_nccl_broadcast_t)
REAL(ncclBcast, fs_nccl_bcast_t)
REAL(ncclReduce, fs_nccl_reduce_t)
REAL(ncclAlltoAll, fs_nccl_alltoall_t)
REAL(ncclAllToAll, fs_nccl_alltoall_t)
REAL(ncclSend, fs_nccl_send_t)
REAL(ncclRecv, fs_nccl_recv_t)

static inline int init_ok(ncclResult_t r) { return r == ncclSuccess || r == ncclInProgress; }

FS_EXPORT ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
  fs_nccl_init_rank_t real = real_ncclCommInitRank();
  if (!real) return ncclInternalError;
  ensure_setup();
  int64_t t0 = fs_now_ns();
  ncclResult_t res = real(comm, nranks, id, rank);
  if (init_ok(res) && comm)
    register_comm(*comm, hash_bytes(&id, sizeof(id), 0), rank, nranks, 0, 0, t0);
  return res;
}

FS_EXPORT ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id,
                                           int rank, ncclConfig_t *config) {
  fs_nccl_init_rank_config_t real = real_ncclCommInitRankConfig();
  if (!real) return ncclInternalError;
  ensure_setup();
  int64_t t0 = fs_now_ns();
  ncclResult_t res = real(comm, nranks, id, rank, config);
  if (init_ok(res) && comm)
    register_comm(*comm, hash_bytes(&id, sizeof(id), 0), rank, nranks, 0, 0, t0);
  return res;
}

FS_EXPORT ncclResult_t ncclCommInitRankScalable(ncclComm_t *comm, int nranks, int myrank, int nId,
                                             ncclUniqueId *ids, ncclConfig_t *config) {
  fs_nccl_init_rank_scalable_t real = real_ncclCommInitRankScalable();
  if (!real) return ncclInternalError;
  ensure_setup();
  int64_t t0 = fs_now_ns();
  ncclResult_t res = real(comm, nranks, myrank, nId, ids, config);
  if (init_ok(res) && comm && ids && nId > 0)
    register_comm(*comm, hash_bytes(ids, sizeof(ncclUniqueId) * (size_t)nId, (uint64_t)nId),
                  myrank, nranks, 0, 0, t0);
  return res;
}

FS_EXPORT ncclResult_t ncclCommInitAll(ncclComm_t *comms, int ndev, const int *devlist) {
  fs_nccl_init_all_t real = real_ncclCommInitAll();
  if (!real) return ncclInternalError;
  ensure_setup();
  int64_t t0 = fs_now_ns();
  ncclResult_t res = real(comms, ndev, devlist);
  if (init_ok(res) && comms) {
    /* one process owns the whole clique: any id shared by its members will do */
    uint64_t n = atomic_fetch_add_explicit(&g_local_ids, 1, memory_order_relaxed);
    uint64_t id = mix64(((uint64_t)getpid() << 32) ^ (uint64_t)t0 ^ mix64(n + 0x51));
    for (int i = 0; i < ndev; i++) register_comm(comms[i], id, i, ndev, 0, 0, t0);
  }
  return res;
}

FS_EXPORT ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
                                  ncclConfig_t *config) {
  fs_nccl_split_t real = real_ncclCommSplit();
  if (!real) return ncclInternalError;
  ensure_setup();
  struct comm_state *parent = comm_get(comm);
  uint64_t k = parent ? atomic_fetch_add_explicit(&parent->splits, 1, memory_order_relaxed) : 0;
  uint64_t pid = parent ? parent->id : 0;
  uint32_t pflags = parent ? (parent->flags & FS_FLAG_LOCAL_COMM) : FS_FLAG_LOCAL_COMM;
  int64_t t0 = fs_now_ns();
  ncclResult_t res = real(comm, color, key, newcomm, config);
  if (init_ok(res) && newcomm && *newcomm) {
    uint64_t id = mix64(pid ^ mix64((uint64_t)(uint32_t)color + 0x9E3779B97F4A7C15ULL * (k + 1)));
    int32_t crank = comm_query("ncclCommUserRank", *newcomm, -1);
    int32_t csize = comm_query("ncclCommCount", *newcomm, -1);
    register_comm(*newcomm, id, crank, csize, pid, pflags, t0);
  }
  return res;
}

static ncclResult_t finish_comm(ncclComm_t comm, fs_nccl_comm_t real, uint32_t flags) {
  if (!real) return ncclInternalError;
  struct comm_state *s = comm_find(comm);
  if (s) {
    write_comm_record(s, 1, 0, fs_now_ns(), FS_NULL_TIME, flags);
    comm_remove(comm);
  }
  return real(comm);
}

FS_EXPORT ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  return finish_comm(comm, real_ncclCommDestroy(), 0);
}

FS_EXPORT ncclResult_t ncclCommAbort(ncclComm_t comm) {
  return finish_comm(comm, real_ncclCommAbort(), FS_FLAG_ABORT);
}

/* ------------------------------------------------------------------------------------------ */
/* groups */

static void write_group(uint8_t phase) {
  struct fs_ring *r = fs_proc_ring_get(&g_ring);
  if (!r || !(fs_ring_ctl(r) & FS_CTL_DETAIL) || (fs_ring_ctl(r) & FS_CTL_PAUSE)) return;
  uint64_t idx;
  struct fs_record *d = fs_ring_reserve(r, &idx);
  if (!d) return;
  memset((char *)d + sizeof(uint64_t), 0, sizeof(*d) - sizeof(uint64_t));
  d->kind = FS_KIND_GROUP;
  d->phase = phase;
  d->op = FS_OP_UNKNOWN;
  d->source = FS_SRC_INTERPOSER;
  d->rank = g_rank;
  d->peer = -1;
  d->device = -1;
  d->seq = (uint64_t)t_depth;
  d->t_ns = fs_now_ns();
  d->t_start_ns = FS_NULL_TIME;
  d->send_count = FS_NULL_COUNT;
  d->recv_count = FS_NULL_COUNT;
  fs_ring_commit(r, d, idx);
}

FS_EXPORT ncclResult_t ncclGroupStart(void) {
  fs_nccl_void_t real = real_ncclGroupStart();
  if (!real) return ncclInternalError;
  ncclResult_t res = real();
  if (res == ncclSuccess) {
    t_depth++;
    write_group(0);
  }
  return res;
}

FS_EXPORT ncclResult_t ncclGroupEnd(void) {
  fs_nccl_void_t real = real_ncclGroupEnd();
  if (!real) return ncclInternalError;
  ncclResult_t res = real();
  if (t_depth > 0) t_depth--;
  write_group(1);
  if (t_depth == 0 && t_ngroup > 0) {
    int n = t_ngroup;
    t_ngroup = 0;
    for (int k = 0; k < n; k++) {
      uint32_t head = t_group[k].head;
      if (res == ncclSuccess || res == ncclInProgress) {
        if (res == ncclInProgress)
          for (uint32_t i = head + 1; i; i = g_pend[i - 1].next)
            g_pend[i - 1].flags |= FS_FLAG_NONBLOCKING;
        launch_chain(head, t_group[k].stream);
      } else {
        complete_chain(head, fs_now_ns(), FS_FLAG_ERROR);
      }
    }
  }
  return res;
}

/* ------------------------------------------------------------------------------------------ */
/* collectives and point-to-point */

FS_EXPORT ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                                  ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                  cudaStream_t stream) {
  fs_nccl_allreduce_t real = real_ncclAllReduce();
  if (FS_UNLIKELY(!real)) return ncclInternalError;
  INTERCEPT(FS_OP_ALLREDUCE, count * dtype_size(datatype), -1, comm, stream,
            real(sendbuff, recvbuff, count, datatype, op, comm, stream));
}

FS_EXPORT ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                                  ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  fs_nccl_allgather_t real = real_ncclAllGather();
  if (FS_UNLIKELY(!real)) return ncclInternalError;
  INTERCEPT(FS_OP_ALLGATHER, sendcount * dtype_size(datatype), -1, comm, stream,
            real(sendbuff, recvbuff, sendcount, datatype, comm, stream));
}

FS_EXPORT ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                                      ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                      cudaStream_t stream) {
  fs_nccl_reducescatter_t real = real_ncclReduceScatter();
  if (FS_UNLIKELY(!real)) return ncclInternalError;
  INTERCEPT(FS_OP_REDUCESCATTER, recvcount * dtype_size(datatype), -1, comm, stream,
            real(sendbuff, recvbuff, recvcount, datatype, op, comm, stream));
}

FS_EXPORT ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count,
                                  ncclDataType_t datatype, int root, ncclComm_t comm,
                                  cudaStream_t stream) {
  fs_nccl_broadcast_t real = real_ncclBroadcast();
  if (FS_UNLIKELY(!real)) return ncclInternalError;
  INTERCEPT(FS_OP_BROADCAST, count * dtype_size(datatype), root, comm, stream,
            real(sendbuff, recvbuff, count, datatype, root, comm, stream));
}

FS_EXPORT ncclResult_t ncclBcast(void *buff, size_t count, ncclDataType_t datatype, int root,
                              ncclComm_t comm, cudaStream_t stream) {
  fs_nccl_bcast_t real = real_ncclBcast();
  if (FS_UNLIKELY(!real)) return ncclInternalError;
  INTERCEPT(FS_OP_BROADCAST, count * dtype_size(datatype), root, comm, stream,
            real(buff, count, datatype, root, comm, stream));
}

FS_EXPORT ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count,
                               ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm,
                               cudaStream_t stream) {
  fs_nccl_reduce_t real = real_ncclReduce();
  if (FS_UNLIKELY(!real)) return ncclInternalError;
  INTERCEPT(FS_OP_REDUCE, count * dtype_size(datatype), root, comm, stream,
            real(sendbuff, recvbuff, count, datatype, op, root, comm, stream));
}

/* bytes of an all-to-all: this rank's whole send buffer (count per peer x comm size) */
static inline uint64_t alltoall_bytes(ncclComm_t comm, size_t count, ncclDataType_t dt) {
  struct comm_state *s = comm_find(comm);
  uint64_t n = (s && s->comm_size > 0) ? (uint64_t)s->comm_size : 1u;
  return (uint64_t)count * dtype_size(dt) * n;
}

FS_EXPORT ncclResult_t ncclAlltoAll(const void *sendbuff, void *recvbuff, size_t count,
                                 ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  fs_nccl_alltoall_t real = real_ncclAlltoAll();
  if (FS_UNLIKELY(!real)) return ncclInternalError;
  INTERCEPT(FS_OP_ALLTOALL, alltoall_bytes(comm, count, datatype), -1, comm, stream,
            real(sendbuff, recvbuff, count, datatype, comm, stream));
}

FS_EXPORT ncclResult_t ncclAllToAll(const void *sendbuff, void *recvbuff, size_t count,
                                 ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  fs_nccl_alltoall_t real = real_ncclAllToAll();
  if (FS_UNLIKELY(!real)) return ncclInternalError;
  INTERCEPT(FS_OP_ALLTOALL, alltoall_bytes(comm, count, datatype), -1, comm, stream,
            real(sendbuff, recvbuff, count, datatype, comm, stream));
}

FS_EXPORT ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer,
                             ncclComm_t comm, cudaStream_t stream) {
  fs_nccl_send_t real = real_ncclSend();
  if (FS_UNLIKELY(!real)) return ncclInternalError;
  INTERCEPT(FS_OP_SEND, count * dtype_size(datatype), peer, comm, stream,
            real(sendbuff, count, datatype, peer, comm, stream));
}

FS_EXPORT ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer,
                             ncclComm_t comm, cudaStream_t stream) {
  fs_nccl_recv_t real = real_ncclRecv();
  if (FS_UNLIKELY(!real)) return ncclInternalError;
  INTERCEPT(FS_OP_RECV, count * dtype_size(datatype), peer, comm, stream,
            real(recvbuff, count, datatype, peer, comm, stream));
}

/* ------------------------------------------------------------------------------------------ */

__attribute__((constructor)) static void fs_interposer_init(void) { g_rank = fs_env_rank(); }

__attribute__((destructor)) static void fs_interposer_fini(void) { fs_proc_ring_close(&g_ring); }
