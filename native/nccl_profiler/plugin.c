/*
 * plugin.c -- failslow NCCL profiler plugin: the version-independent core (entry points:
 * plugin_v45.c for API v4/v5, plugin_v67.c for v6/v7). Exports ncclProfiler_v7 ... ncclProfiler_v4; every other
 * symbol is hidden.
 *
 * Per communicator (init) it records, into the process's profiler ring:
 *   - a COMM row: comm id = NCCL's commHash/commId (identical on all members), rank, nranks;
 *   - per operation an `enter` row: op, bytes (count x datatype size), peer/root, seq (our own
 *     per-communicator counter over collectives and point-to-point calls, CCL-D's Trace ID
 *     counter) and the host time of the API call (v5 CollApi/P2pApi start; v4 has no API
 *     events, so the Coll/P2p task start, i.e. the kernel-launch time, flagged
 *     FS_FLAG_ENTER_AT_LAUNCH);
 *   - an `end` row once the operation completed on the device. A task event's stopEvent only
 *     means "enqueued", so completion is derived from its children (ProxyOp and KernelCh events,
 *     reference counted): the operation is complete when its tasks are stopped, no child is
 *     live and the KernelCh events of all its channels have stopped. t = host time of the last
 *     child stop, t_start = host time of the first child start, send/recv counts = network steps
 *     executed (CCL-D's SendCount/RecvCount). Operations of one communicator execute in launch
 *     order, so when an operation completes, every earlier-launched one still open is closed
 *     too (FS_FLAG_INFERRED_END) -- this covers operations without child events;
 *   - v6 copy-engine collectives (CeColl, no kernel and no device-side child events) are
 *     operations whose end is always inferred from the next completed operation; v7 KernelPhase
 *     events of symmetric kernels give the transfer start (compute phase, after the initial
 *     synchronisation with the peers) instead of the kernel start;
 *   - detail mode (control word FS_CTL_DETAIL): ProxyStep events give `progress` rows
 *     (throttled), NetPlugin IB events give per-device `link` samples (MegaTrace §III-B-2).
 *
 * Events are taken from fixed per-communicator pools (operations, child events); when a pool is
 * exhausted the event is dropped (NULL handle) and header.pool_dropped is incremented. No lock,
 * allocation or system call on the event path. Parent pointers of ProxyOp events are only
 * dereferenced when the originating pid is ours (PXN: proxy ops may come from another process).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "failslow_ring.h"
#include "plugin_core.h"


static struct fs_proc_ring g_ring = {
    .collector = FS_SRC_PROFILER,
    .tag = "prof",
    .caps = FS_CAP_END_ROWS | FS_CAP_T_START | FS_CAP_COUNTS | FS_CAP_LINK,
};
static int32_t g_rank = -1;
pid_t g_pid;
static int64_t g_progress_ns = 1000000;  /* FAILSLOW_PROGRESS_US */
static int64_t g_link_ns = 100000000;    /* FAILSLOW_LINK_PERIOD_MS */
static uint32_t g_op_pool = 1024;        /* FAILSLOW_PROFILER_OPS */
static uint32_t g_child_pool = 4096;     /* FAILSLOW_PROFILER_CHILDREN */
static _Atomic(int *) g_mask_ptr;        /* NCCL's activation mask (one per process) */
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static _Atomic int g_mask_applied = -1;

/* Handles returned for events we do not track. A dropped API event must not make its task
 * events create a second operation (which would advance seq twice on this rank only). */
struct fs_ev g_dummy = {EV_DUMMY};
static struct fs_ev g_dropped_api = {EV_DUMMY};
static struct fs_ev g_graph_api = {EV_DUMMY};

enum op_state { OP_FREE = 0, OP_OPEN = 1, OP_DONE = 2 };

struct fs_pctx;

struct prof_op {
  _Atomic uint32_t state;
  struct fs_ev api_ev;  /* handle of the CollApi/P2pApi event (v5) */
  struct fs_ev task_ev; /* handle of the Coll/P2p task event */
  struct fs_pctx *ctx;
  _Atomic uint64_t seq;
  uint64_t bytes;
  int64_t t_enter;
  int32_t peer;
  uint32_t flags;
  uint8_t op;
  _Atomic int enter_written;
  _Atomic int api_live;
  _Atomic int tasks_started, tasks_stopped;
  _Atomic int live;     /* ProxyOp + KernelCh children started and not stopped */
  _Atomic int children; /* ProxyOp + KernelCh children ever started */
  _Atomic int proxies;  /* ProxyOp children ever started */
  _Atomic uint32_t kern_expected, kern_stopped;
  _Atomic int64_t t_first, t_last;
  _Atomic int64_t t_xfer; /* v7: host time of the first compute-phase start (INT64_MAX: none) */
  _Atomic uint64_t send_steps, recv_steps;
  _Atomic int64_t last_progress;
  _Atomic uint64_t launched_before; /* ctx->launched_upto when the first task started */
};

struct fs_child {
  struct fs_ev ev;
  _Atomic uint32_t state; /* 0 free, 1 busy */
  struct prof_op *op;
  struct fs_child *parent;
  int is_send;
  int nsteps;
  _Atomic int steps_done;
  int net_dev;
  uint64_t net_len;
};

struct fs_pctx {
  uint64_t comm;
  int32_t comm_rank, comm_size, nnodes, version;
  _Atomic uint64_t seq;
  _Atomic uint64_t launched_upto; /* max seq + 1 over stopped (enqueued) task events */
  _Atomic uint64_t infer_from;
  struct prof_op *ops;
  _Atomic(struct prof_op *) *by_seq;
  uint32_t op_mask;
  _Atomic uint32_t op_cursor;
  struct fs_child *kids;
  uint32_t kid_mask;
  _Atomic uint32_t kid_cursor;
  char name[16];
};

#define NET_DEVS 32
struct net_dev {
  _Atomic uint64_t posted, completed, bytes_posted, bytes;
  _Atomic int64_t last_sample;
};
static struct net_dev g_net[NET_DEVS];

/* ------------------------------------------------------------------------------------------ */
/* small helpers */

static inline void atomic_max_i64(_Atomic int64_t *p, int64_t v) {
  int64_t cur = atomic_load_explicit(p, FS_RLX);
  while (cur < v && !atomic_compare_exchange_weak_explicit(p, &cur, v, FS_AR, FS_RLX)) {
  }
}

static inline void atomic_min_i64(_Atomic int64_t *p, int64_t v) {
  int64_t cur = atomic_load_explicit(p, FS_RLX);
  while (cur > v && !atomic_compare_exchange_weak_explicit(p, &cur, v, FS_AR, FS_RLX)) {
  }
}

static inline void atomic_max_u64(_Atomic uint64_t *p, uint64_t v) {
  uint64_t cur = atomic_load_explicit(p, FS_RLX);
  while (cur < v && !atomic_compare_exchange_weak_explicit(p, &cur, v, FS_AR, FS_RLX)) {
  }
}

/* "AllReduce", "ReduceScatter", "Send", ... -> fs_op */
uint8_t op_code(const char *func) {
  if (!func) return FS_OP_UNKNOWN;
  if (!strncasecmp(func, "nccl", 4)) func += 4;
  static const struct {
    const char *name;
    uint8_t code;
  } names[] = {{"AllReduce", FS_OP_ALLREDUCE}, {"AllGather", FS_OP_ALLGATHER},
               {"ReduceScatter", FS_OP_REDUCESCATTER}, {"Broadcast", FS_OP_BROADCAST},
               {"Bcast", FS_OP_BROADCAST}, {"Reduce", FS_OP_REDUCE},
               {"AllToAll", FS_OP_ALLTOALL}, {"Send", FS_OP_SEND}, {"Recv", FS_OP_RECV}};
  for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
    if (!strcasecmp(func, names[i].name)) return names[i].code;
  return FS_OP_UNKNOWN;
}

/* "ncclFloat32" -> 4, "ncclBfloat16" -> 2, "ncclFloat8e4m3" -> 1, unknown -> 1 */
uint64_t dtype_size(const char *dt) {
  if (!dt) return 1;
  if (strstr(dt, "8e")) return 1;
  size_t n = strlen(dt);
  size_t i = n;
  while (i > 0 && dt[i - 1] >= '0' && dt[i - 1] <= '9') i--;
  if (i == n) return 1;
  long bits = strtol(dt + i, NULL, 10);
  return bits >= 8 ? (uint64_t)(bits / 8) : 1u;
}

static inline struct prof_op *op_of_api(void *h) {
  return (struct prof_op *)((char *)h - offsetof(struct prof_op, api_ev));
}
static inline struct prof_op *op_of_task(void *h) {
  return (struct prof_op *)((char *)h - offsetof(struct prof_op, task_ev));
}

static inline struct fs_ring *ring_now(void) { return fs_proc_ring_get(&g_ring); }

/* ------------------------------------------------------------------------------------------ */
/* activation mask */

static int mask_for(int version, uint32_t ctl) {
  int api = ncclProfileCollApi | ncclProfileP2pApi;
  if (ctl & FS_CTL_PAUSE) /* keep the events that advance seq */
    return version >= 5 ? api : (ncclProfileColl | ncclProfileP2p);
  int m = ncclProfileColl | ncclProfileP2p | ncclProfileProxyOp | ncclProfileKernelCh;
  if (version >= 5) m |= api;
  if (version >= 6) m |= ncclProfileCeColl;
  if (version >= 7) m |= ncclProfileKernelPhase;
  if (ctl & FS_CTL_DETAIL) m |= ncclProfileProxyStep | ncclProfileNetPlugin;
  return m;
}

static inline void sync_mask(const struct fs_pctx *ctx, uint32_t ctl) {
  int want = mask_for(ctx->version, ctl);
  if (FS_UNLIKELY(want != atomic_load_explicit(&g_mask_applied, FS_RLX))) {
    atomic_store_explicit(&g_mask_applied, want, FS_RLX);
    int *mp = atomic_load_explicit(&g_mask_ptr, FS_ACQ);
    if (mp) __atomic_store_n(mp, want, __ATOMIC_RELAXED);
  }
}

/* ------------------------------------------------------------------------------------------ */
/* records */

static void write_coll(struct fs_ring *r, const struct prof_op *op, uint8_t phase, int64_t t,
                       int64_t t_start, uint64_t send, uint64_t recv, uint32_t flags) {
  const struct fs_pctx *ctx = op->ctx;
  uint64_t idx;
  struct fs_record *d = fs_ring_reserve(r, &idx);
  if (FS_UNLIKELY(!d)) return;
  d->kind = FS_KIND_COLL;
  d->op = op->op;
  d->phase = phase;
  d->source = FS_SRC_PROFILER;
  d->rank = g_rank;
  d->comm_rank = ctx->comm_rank;
  d->comm_size = ctx->comm_size;
  d->peer = op->peer;
  d->device = -1;
  d->comm = ctx->comm;
  d->seq = atomic_load_explicit(&op->seq, FS_RLX);
  d->bytes = op->bytes;
  d->t_ns = t;
  d->t_start_ns = t_start;
  d->send_count = send;
  d->recv_count = recv;
  d->posted = 0;
  d->completed = 0;
  d->flags = flags;
  d->qp_num = 0;
  memset(d->name, 0, sizeof(d->name));
  fs_ring_commit(r, d, idx);
}

static void write_enter(struct prof_op *op) {
  int expected = 0;
  if (!atomic_compare_exchange_strong_explicit(&op->enter_written, &expected, 1, FS_AR, FS_RLX)) return;
  struct fs_ring *r = ring_now();
  if (r)
    write_coll(r, op, FS_PHASE_ENTER, op->t_enter, FS_NULL_TIME, FS_NULL_COUNT, FS_NULL_COUNT,
               op->flags);
}

static void write_end(struct prof_op *op, int64_t t, uint32_t extra) {
  struct fs_ring *r = ring_now();
  if (!r) return;
  int64_t t_first = atomic_load_explicit(&op->t_first, FS_ACQ);
  int64_t t_xfer = atomic_load_explicit(&op->t_xfer, FS_ACQ);
  if (t_xfer != INT64_MAX) t_first = t_xfer;
  int has_children = atomic_load_explicit(&op->children, FS_ACQ) > 0;
  int has_proxies = atomic_load_explicit(&op->proxies, FS_ACQ) > 0;
  uint64_t send = has_proxies ? atomic_load_explicit(&op->send_steps, FS_ACQ) : FS_NULL_COUNT;
  uint64_t recv = has_proxies ? atomic_load_explicit(&op->recv_steps, FS_ACQ) : FS_NULL_COUNT;
  write_coll(r, op, FS_PHASE_END, t, has_children ? t_first : FS_NULL_TIME, send, recv,
             op->flags | extra);
}

static void write_comm(const struct fs_pctx *ctx, uint8_t phase) {
  struct fs_ring *r = ring_now();
  if (!r) return;
  struct fs_record rec;
  fs_comm_record(&rec, phase, FS_SRC_PROFILER, g_rank, ctx->comm_rank, ctx->comm_size,
                 ctx->comm, fs_now_ns(), FS_NULL_TIME);
  rec.device = -1;
  rec.bytes = (uint64_t)ctx->nnodes;
  memcpy(rec.name, ctx->name, sizeof(rec.name));
  fs_ring_put(r, &rec);
}

/* ------------------------------------------------------------------------------------------ */
/* pools */

static struct prof_op *op_alloc(struct fs_pctx *ctx) {
  uint32_t c = atomic_fetch_add_explicit(&ctx->op_cursor, 1, FS_RLX);
  for (uint32_t k = 0; k < 16; k++) {
    struct prof_op *op = &ctx->ops[(c + k) & ctx->op_mask];
    uint32_t expected = OP_FREE;
    if (atomic_compare_exchange_strong_explicit(&op->state, &expected, OP_OPEN, FS_ACQ, FS_RLX)) {
      op->bytes = 0;
      op->t_enter = 0;
      op->peer = -1;
      op->flags = 0;
      op->op = FS_OP_UNKNOWN;
      atomic_store_explicit(&op->enter_written, 0, FS_RLX);
      atomic_store_explicit(&op->api_live, 0, FS_RLX);
      atomic_store_explicit(&op->tasks_started, 0, FS_RLX);
      atomic_store_explicit(&op->tasks_stopped, 0, FS_RLX);
      atomic_store_explicit(&op->live, 0, FS_RLX);
      atomic_store_explicit(&op->children, 0, FS_RLX);
      atomic_store_explicit(&op->proxies, 0, FS_RLX);
      atomic_store_explicit(&op->kern_expected, 0, FS_RLX);
      atomic_store_explicit(&op->kern_stopped, 0, FS_RLX);
      atomic_store_explicit(&op->t_first, INT64_MAX, FS_RLX);
      atomic_store_explicit(&op->t_last, 0, FS_RLX);
      atomic_store_explicit(&op->t_xfer, INT64_MAX, FS_RLX);
      atomic_store_explicit(&op->send_steps, 0, FS_RLX);
      atomic_store_explicit(&op->recv_steps, 0, FS_RLX);
      atomic_store_explicit(&op->last_progress, 0, FS_RLX);
      atomic_store_explicit(&op->launched_before, 0, FS_RLX);
      return op;
    }
  }
  struct fs_ring *r = ring_now();
  if (r) fs_pool_dropped(r);
  return NULL;
}

static void op_publish(struct fs_pctx *ctx, struct prof_op *op, uint64_t seq) {
  atomic_store_explicit(&op->seq, seq, FS_RLX);
  atomic_store_explicit(&ctx->by_seq[seq & ctx->op_mask], op, FS_REL);
}

static struct fs_child *child_alloc(struct fs_pctx *ctx, uint8_t type) {
  uint32_t c = atomic_fetch_add_explicit(&ctx->kid_cursor, 1, FS_RLX);
  for (uint32_t k = 0; k < 16; k++) {
    struct fs_child *ch = &ctx->kids[(c + k) & ctx->kid_mask];
    uint32_t expected = 0;
    if (atomic_compare_exchange_strong_explicit(&ch->state, &expected, 1, FS_ACQ, FS_RLX)) {
      ch->ev.type = type;
      ch->op = NULL;
      ch->parent = NULL;
      ch->is_send = 0;
      ch->nsteps = 0;
      atomic_store_explicit(&ch->steps_done, 0, FS_RLX);
      ch->net_dev = -1;
      ch->net_len = 0;
      return ch;
    }
  }
  struct fs_ring *r = ring_now();
  if (r) fs_pool_dropped(r);
  return NULL;
}

static inline void child_free(struct fs_child *ch) {
  ch->ev.type = EV_NONE;
  atomic_store_explicit(&ch->state, 0, FS_REL);
}

/* Free an operation slot once nothing can reference it any more. */
static void try_release(struct prof_op *op) {
  if (atomic_load_explicit(&op->state, FS_ACQ) != OP_DONE) return;
  if (atomic_load_explicit(&op->api_live, FS_ACQ) != 0) return;
  if (atomic_load_explicit(&op->tasks_stopped, FS_ACQ) != atomic_load_explicit(&op->tasks_started, FS_ACQ))
    return;
  if (atomic_load_explicit(&op->live, FS_ACQ) != 0) return;
  uint32_t expected = OP_DONE;
  atomic_compare_exchange_strong_explicit(&op->state, &expected, OP_FREE, FS_AR, FS_RLX);
}

/* Close every still-open operation of ctx launched before `upto` (seq < upto). */
static void infer_earlier(struct fs_pctx *ctx, uint64_t upto, int64_t t) {
  uint64_t from = atomic_load_explicit(&ctx->infer_from, FS_ACQ);
  if (upto <= from) return;
  atomic_max_u64(&ctx->infer_from, upto);
  uint64_t n = (uint64_t)ctx->op_mask + 1;
  if (upto - from > n) from = upto - n;
  for (uint64_t j = from; j < upto; j++) {
    struct prof_op *op = atomic_load_explicit(&ctx->by_seq[j & ctx->op_mask], FS_ACQ);
    if (!op || atomic_load_explicit(&op->seq, FS_RLX) != j) continue;
    uint32_t expected = OP_OPEN;
    if (!atomic_compare_exchange_strong_explicit(&op->state, &expected, OP_DONE, FS_AR, FS_RLX)) continue;
    if (atomic_load_explicit(&op->enter_written, FS_ACQ)) write_end(op, t, FS_FLAG_INFERRED_END);
    try_release(op);
  }
}

static void maybe_complete(struct prof_op *op) {
  if (atomic_load_explicit(&op->state, FS_ACQ) != OP_OPEN) return;
  int started = atomic_load_explicit(&op->tasks_started, FS_ACQ);
  if (started == 0 || atomic_load_explicit(&op->tasks_stopped, FS_ACQ) < started) return;
  if (atomic_load_explicit(&op->live, FS_ACQ) != 0) return;
  if (atomic_load_explicit(&op->children, FS_ACQ) == 0) return;
  if (atomic_load_explicit(&op->kern_stopped, FS_ACQ) < atomic_load_explicit(&op->kern_expected, FS_ACQ))
    return;
  uint32_t expected = OP_OPEN;
  if (!atomic_compare_exchange_strong_explicit(&op->state, &expected, OP_DONE, FS_AR, FS_RLX)) return;
  int64_t t = atomic_load_explicit(&op->t_last, FS_ACQ);
  if (atomic_load_explicit(&op->enter_written, FS_ACQ)) write_end(op, t, 0);
  infer_earlier(op->ctx, atomic_load_explicit(&op->launched_before, FS_ACQ), t);
}

static void progress_row(struct prof_op *op, int64_t now) {
  int64_t last = atomic_load_explicit(&op->last_progress, FS_RLX);
  if (now - last < g_progress_ns) return;
  if (!atomic_compare_exchange_strong_explicit(&op->last_progress, &last, now, FS_RLX, FS_RLX)) return;
  struct fs_ring *r = ring_now();
  if (!r) return;
  uint64_t idx;
  struct fs_record *d = fs_ring_reserve(r, &idx);
  if (!d) return;
  memset((char *)d + sizeof(uint64_t), 0, sizeof(*d) - sizeof(uint64_t));
  d->kind = FS_KIND_PROGRESS;
  d->op = op->op;
  d->source = FS_SRC_PROFILER;
  d->rank = g_rank;
  d->comm_rank = op->ctx->comm_rank;
  d->comm_size = op->ctx->comm_size;
  d->peer = op->peer;
  d->device = -1;
  d->comm = op->ctx->comm;
  d->seq = atomic_load_explicit(&op->seq, FS_RLX);
  d->t_ns = now;
  d->t_start_ns = FS_NULL_TIME;
  d->send_count = atomic_load_explicit(&op->send_steps, FS_RLX);
  d->recv_count = atomic_load_explicit(&op->recv_steps, FS_RLX);
  fs_ring_commit(r, d, idx);
}

static void link_sample(int dev, int64_t now, int force) {
  struct net_dev *nd = &g_net[dev];
  int64_t last = atomic_load_explicit(&nd->last_sample, FS_RLX);
  if (!force && now - last < g_link_ns) return;
  if (!atomic_compare_exchange_strong_explicit(&nd->last_sample, &last, now, FS_RLX, FS_RLX)) return;
  struct fs_ring *r = ring_now();
  if (!r) return;
  uint64_t idx;
  struct fs_record *d = fs_ring_reserve(r, &idx);
  if (!d) return;
  memset((char *)d + sizeof(uint64_t), 0, sizeof(*d) - sizeof(uint64_t));
  d->kind = FS_KIND_LINK;
  d->op = FS_OP_UNKNOWN;
  d->source = FS_SRC_PROFILER;
  d->rank = g_rank;
  d->peer = -1;
  d->device = dev;
  d->t_ns = now;
  d->t_start_ns = FS_NULL_TIME;
  d->posted = atomic_load_explicit(&nd->posted, FS_RLX);
  d->completed = atomic_load_explicit(&nd->completed, FS_RLX);
  d->bytes = atomic_load_explicit(&nd->bytes, FS_RLX);
  d->send_count = atomic_load_explicit(&nd->bytes_posted, FS_RLX);
  d->recv_count = FS_NULL_COUNT;
  snprintf(d->name, sizeof(d->name), "ncclnet%d", dev);
  fs_ring_commit(r, d, idx);
}

/* ------------------------------------------------------------------------------------------ */
/* init / finalize */

static void read_env(void) {
  g_pid = getpid();
  g_rank = fs_env_rank();
  g_progress_ns = fs_env_ns("FAILSLOW_PROGRESS_US", 1000, 1000);
  g_link_ns = fs_env_ns("FAILSLOW_LINK_PERIOD_MS", 100, 1000000);
  g_op_pool = (uint32_t)fs_env_pow2("FAILSLOW_PROFILER_OPS", 1024, 16, 1u << 20);
  g_child_pool = (uint32_t)fs_env_pow2("FAILSLOW_PROFILER_CHILDREN", 4096, 16, 1u << 20);
}

ncclResult_t init_common(void **context, int *mask, const char *name, uint64_t comm,
                                int nnodes, int nranks, int rank, int version) {
  *context = NULL;
  pthread_once(&g_once, read_env);
  struct fs_ring *r = ring_now();
  if (!r) return ncclInternalError; /* disabled or no ring: NCCL then disables the plugin */

  struct fs_pctx *ctx = (struct fs_pctx *)calloc(1, sizeof(*ctx));
  if (!ctx) return ncclSystemError;
  ctx->ops = (struct prof_op *)calloc(g_op_pool, sizeof(struct prof_op));
  ctx->by_seq = (_Atomic(struct prof_op *) *)calloc(g_op_pool, sizeof(*ctx->by_seq));
  ctx->kids = (struct fs_child *)calloc(g_child_pool, sizeof(struct fs_child));
  if (!ctx->ops || !ctx->by_seq || !ctx->kids) {
    free(ctx->ops);
    free((void *)ctx->by_seq);
    free(ctx->kids);
    free(ctx);
    return ncclSystemError;
  }
  ctx->op_mask = g_op_pool - 1;
  ctx->kid_mask = g_child_pool - 1;
  for (uint32_t i = 0; i < g_op_pool; i++) {
    ctx->ops[i].api_ev.type = EV_API;
    ctx->ops[i].task_ev.type = EV_TASK;
    ctx->ops[i].ctx = ctx;
    atomic_store_explicit(&ctx->ops[i].seq, UINT64_MAX, FS_RLX);
  }
  ctx->comm = comm;
  ctx->comm_rank = rank;
  ctx->comm_size = nranks;
  ctx->nnodes = nnodes;
  ctx->version = version;
  if (name) snprintf(ctx->name, sizeof(ctx->name), "%s", name);

  atomic_store_explicit(&g_mask_ptr, mask, FS_REL);
  int m = mask_for(version, fs_ring_ctl(r));
  atomic_store_explicit(&g_mask_applied, m, FS_RLX);
  if (mask) __atomic_store_n(mask, m, __ATOMIC_RELAXED);
  write_comm(ctx, 0);
  *context = ctx;
  return ncclSuccess;
}

ncclResult_t fs_finalize(void *context) {
  struct fs_pctx *ctx = (struct fs_pctx *)context;
  if (!ctx) return ncclSuccess;
  write_comm(ctx, 1);
  free(ctx->ops);
  free((void *)ctx->by_seq);
  free(ctx->kids);
  free(ctx);
  return ncclSuccess;
}

/* ------------------------------------------------------------------------------------------ */
/* events (version-independent core) */

/* v5 API event: assigns seq and the API-call time; collectives write their enter row now. */
void *start_api(struct fs_pctx *ctx, int is_p2p, const char *func, size_t count,
                       const char *datatype, int root, int graph) {
  uint64_t seq = atomic_fetch_add_explicit(&ctx->seq, 1, FS_RLX);
  struct fs_ring *r = ring_now();
  uint32_t ctl = r ? fs_ring_ctl(r) : FS_CTL_PAUSE;
  sync_mask(ctx, ctl);
  if (ctl & FS_CTL_PAUSE) return &g_dropped_api;
  if (graph) return &g_graph_api; /* captured: tasks show up per replay, with their own seq */
  struct prof_op *op = op_alloc(ctx);
  if (!op) return &g_dropped_api;
  op->t_enter = fs_now_ns();
  op->op = op_code(func);
  op->bytes = (uint64_t)count * dtype_size(datatype);
  if (op->op == FS_OP_ALLTOALL && ctx->comm_size > 0) op->bytes *= (uint64_t)ctx->comm_size;
  op->peer = (op->op == FS_OP_BROADCAST || op->op == FS_OP_REDUCE) ? root : -1;
  atomic_store_explicit(&op->api_live, 1, FS_REL);
  op_publish(ctx, op, seq);
  if (!is_p2p) write_enter(op); /* point-to-point: the peer is only known at task start */
  return &op->api_ev;
}

static void task_attach(struct fs_pctx *ctx, struct prof_op *op, const struct task_info *ti) {
  if (atomic_fetch_add_explicit(&op->tasks_started, 1, FS_AR) == 0) {
    atomic_store_explicit(&op->launched_before, atomic_load_explicit(&ctx->launched_upto, FS_ACQ),
                          FS_REL);
    if (op->peer < 0 && (op->op == FS_OP_SEND || op->op == FS_OP_RECV)) op->peer = ti->peer;
    write_enter(op);
  }
  int m = atomic_load_explicit(&g_mask_applied, FS_RLX);
  if ((m & ncclProfileKernelCh) && ti->nchannels)
    atomic_fetch_add_explicit(&op->kern_expected, ti->nchannels, FS_AR);
}

/* A task whose operation is created at launch: v4, or a v5 graph replay. */
static void *start_task_new(struct fs_pctx *ctx, const struct task_info *ti, uint32_t flags) {
  uint64_t seq = atomic_fetch_add_explicit(&ctx->seq, 1, FS_RLX);
  struct fs_ring *r = ring_now();
  uint32_t ctl = r ? fs_ring_ctl(r) : FS_CTL_PAUSE;
  sync_mask(ctx, ctl);
  if (ctl & FS_CTL_PAUSE) return &g_dummy;
  struct prof_op *op = op_alloc(ctx);
  if (!op) return NULL;
  op->t_enter = fs_now_ns();
  op->op = ti->op;
  op->bytes = ti->bytes;
  if (op->op == FS_OP_ALLTOALL && ctx->comm_size > 0) op->bytes *= (uint64_t)ctx->comm_size;
  op->peer = ti->peer;
  op->flags = flags;
  op_publish(ctx, op, seq);
  task_attach(ctx, op, ti);
  return &op->task_ev;
}

void *start_task(struct fs_pctx *ctx, void *parent, const struct task_info *ti) {
  if (ctx->version >= 5) {
    if (parent == &g_dropped_api) return &g_dummy;
    if (parent && ((struct fs_ev *)parent)->type == EV_API) {
      struct prof_op *op = op_of_api(parent);
      if (atomic_load_explicit(&op->state, FS_ACQ) != OP_OPEN) return &g_dummy;
      task_attach(ctx, op, ti);
      return &op->task_ev;
    }
    return start_task_new(ctx, ti, FS_FLAG_ENTER_AT_LAUNCH |
                                       (parent == &g_graph_api ? FS_FLAG_GRAPH : 0u));
  }
  return start_task_new(ctx, ti, FS_FLAG_ENTER_AT_LAUNCH);
}

void *start_child(struct fs_pctx *ctx, uint8_t type, void *parent, pid_t pid, int is_send,
                         int nsteps) {
  if (!parent) return NULL;
  if (type == EV_PROXYOP && pid != g_pid) return NULL; /* PXN: parent lives in another process */
  if (((struct fs_ev *)parent)->type != EV_TASK) return NULL;
  struct prof_op *op = op_of_task(parent);
  if (atomic_load_explicit(&op->state, FS_ACQ) != OP_OPEN) return NULL;
  struct fs_child *ch = child_alloc(ctx, type);
  if (!ch) return NULL;
  ch->op = op;
  ch->is_send = is_send;
  ch->nsteps = nsteps;
  atomic_min_i64(&op->t_first, fs_now_ns());
  if (type == EV_PROXYOP) atomic_fetch_add_explicit(&op->proxies, 1, FS_AR);
  atomic_fetch_add_explicit(&op->children, 1, FS_AR);
  atomic_fetch_add_explicit(&op->live, 1, FS_AR);
  return &ch->ev;
}

void *start_step(struct fs_pctx *ctx, void *parent) {
  if (!parent || ((struct fs_ev *)parent)->type != EV_PROXYOP) return NULL;
  struct fs_child *ch = child_alloc(ctx, EV_STEP);
  if (!ch) return NULL;
  ch->parent = (struct fs_child *)parent;
  ch->op = ch->parent->op;
  return &ch->ev;
}

void *start_net(struct fs_pctx *ctx, int64_t id, void *data) {
  if (!data) return NULL;
  uint32_t type = (uint32_t)id & NCCL_PROFILER_NET_TYPE_MASK;
  uint32_t ver = (uint32_t)id & NCCL_PROFILER_NET_VER_MASK;
  if (type != NCCL_PROFILER_NET_TYPE_IB || ver != NCCL_PROFILER_NET_IB_VER) return NULL;
  const ncclProfilerNetIbDescr_v1_t *d = (const ncclProfilerNetIbDescr_v1_t *)data;
  if (d->type != ncclProfileQp || d->qp.device < 0 || d->qp.device >= NET_DEVS) return NULL;
  struct fs_child *ch = child_alloc(ctx, EV_NET);
  if (!ch) return NULL;
  ch->net_dev = d->qp.device;
  ch->net_len = d->qp.length;
  atomic_fetch_add_explicit(&g_net[ch->net_dev].posted, 1, FS_RLX);
  atomic_fetch_add_explicit(&g_net[ch->net_dev].bytes_posted, ch->net_len, FS_RLX);
  return &ch->ev;
}

/* v7 KernelPhase (parent: a KernelCh event): the compute phase starts once every peer has
 * joined, so its host time is the transfer start of the operation. */
void *start_phase(void *parent, int phase_id) {
  if (!parent || ((struct fs_ev *)parent)->type != EV_KERNEL) return NULL;
  struct fs_child *ch = (struct fs_child *)parent;
  if (phase_id == FS_KPHASE_COMPUTE && ch->op) atomic_min_i64(&ch->op->t_xfer, fs_now_ns());
  return &g_dummy;
}

ncclResult_t fs_stop(void *h) {
  if (!h) return ncclSuccess;
  struct fs_ev *ev = (struct fs_ev *)h;
  switch (ev->type) {
    case EV_API: {
      struct prof_op *op = op_of_api(h);
      atomic_store_explicit(&op->api_live, 0, FS_REL);
      try_release(op);
      break;
    }
    case EV_TASK: {
      struct prof_op *op = op_of_task(h);
      atomic_max_u64(&op->ctx->launched_upto, atomic_load_explicit(&op->seq, FS_RLX) + 1);
      atomic_fetch_add_explicit(&op->tasks_stopped, 1, FS_AR);
      maybe_complete(op);
      try_release(op);
      break;
    }
    case EV_PROXYOP:
    case EV_KERNEL: {
      struct fs_child *ch = (struct fs_child *)h;
      struct prof_op *op = ch->op;
      int64_t now = fs_now_ns();
      if (ev->type == EV_PROXYOP) {
        int rest = ch->nsteps - atomic_load_explicit(&ch->steps_done, FS_ACQ);
        if (rest > 0)
          atomic_fetch_add_explicit(ch->is_send ? &op->send_steps : &op->recv_steps,
                                    (uint64_t)rest, FS_AR);
      } else {
        atomic_fetch_add_explicit(&op->kern_stopped, 1, FS_AR);
      }
      atomic_max_i64(&op->t_last, now);
      child_free(ch);
      atomic_fetch_sub_explicit(&op->live, 1, FS_AR);
      maybe_complete(op);
      try_release(op);
      break;
    }
    case EV_STEP: {
      struct fs_child *ch = (struct fs_child *)h;
      struct fs_child *pop = ch->parent;
      struct prof_op *op = ch->op;
      if (pop && op && atomic_load_explicit(&pop->state, FS_ACQ) && pop->ev.type == EV_PROXYOP) {
        atomic_fetch_add_explicit(&pop->steps_done, 1, FS_AR);
        atomic_fetch_add_explicit(pop->is_send ? &op->send_steps : &op->recv_steps, 1, FS_AR);
        struct fs_ring *r = ring_now();
        if (r && (fs_ring_ctl(r) & FS_CTL_DETAIL)) progress_row(op, fs_now_ns());
      }
      child_free(ch);
      break;
    }
    case EV_NET: {
      struct fs_child *ch = (struct fs_child *)h;
      int dev = ch->net_dev;
      uint64_t len = ch->net_len;
      child_free(ch);
      if (dev >= 0 && dev < NET_DEVS) {
        atomic_fetch_add_explicit(&g_net[dev].completed, 1, FS_RLX);
        atomic_fetch_add_explicit(&g_net[dev].bytes, len, FS_RLX);
        link_sample(dev, fs_now_ns(), 0);
      }
      break;
    }
    default:
      break;
  }
  return ncclSuccess;
}

ncclResult_t fs_record_state(void *h, ncclProfilerEventState_t state,
                                    ncclProfilerEventStateArgs_v4_t *args) {
  (void)h;
  (void)state;
  (void)args; /* KernelChStop carries a GPU timer; completion uses host time at stopEvent */
  return ncclSuccess;
}

__attribute__((destructor)) static void fs_profiler_fini(void) { fs_proc_ring_close(&g_ring); }
