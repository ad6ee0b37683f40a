/*
 * verbs.c -- RDMA work-request telemetry (MegaTrace §III-B-2 "WR measurement": posted vs.
 * completed work requests per queue pair -- the in-flight count -- and completed bytes, whose
 * slope over a window is the throughput).
 *
 * How the shim gets in (LD_PRELOAD=libfailslow_verbs.so):
 *  - NCCL does not link libibverbs: it dlopen()s it and resolves every ibv_* function with
 *    dlvsym(handle, name, "IBVERBS_1.1") on its own handle, which bypasses LD_PRELOAD symbol
 *    interposition. The shim therefore exports `dlvsym`: for ibv_open_device, ibv_close_device,
 *    ibv_create_qp and ibv_destroy_qp it returns its own wrappers (and remembers the real
 *    functions); every other lookup is forwarded unchanged, RTLD_NEXT / RTLD_DEFAULT lookups
 *    by a tail jump that keeps the caller's return address (see the trampoline below).
 *  - Programs and net plugins that link libibverbs directly reach the same wrappers through
 *    ordinary symbol interposition (the wrappers are exported under the ibv_* names).
 *  - ibv_post_send and ibv_poll_cq are inline in verbs.h (they call ctx->ops.post_send /
 *    ctx->ops.poll_cq), so the wrapper of ibv_open_device replaces those two pointers in every
 *    new context with counting versions that call the provider's originals.
 *
 * Counting, per queue pair (lock-free; assumes, like NCCL's proxy thread, one thread posting to
 * a queue pair at a time and one thread polling a completion queue at a time; queue pairs
 * created before the shim saw them are counted approximately -- completions one by one):
 *  - post_send: WRs and bytes (sum of SGE lengths) posted; for each signaled WR (or every WR if
 *    the QP was created with sq_sig_all) the cumulative (WRs, bytes) up to it is queued in a
 *    per-QP FIFO sized at ibv_create_qp to max_send_wr + CQ size (its upper bound).
 *  - poll_cq: a send completion completes every WR up to the next queued mark (send queues
 *    complete in order), so completed WRs and bytes are exact even though NCCL signals only the
 *    last WR of a chain. Receive completions are counted separately (recv_count).
 * A sampler thread (started with the first context) writes a LINK record per device every
 * FAILSLOW_LINK_PERIOD_MS (default 100) -- and per queue pair in detail mode -- so a NIC whose
 * in-flight count stays up while nothing completes is visible even if the process hangs.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "failslow_ring.h"
#include "verbs_abi.h"


static struct fs_proc_ring g_ring = {.collector = FS_SRC_VERBS, .tag = "verbs", .caps = FS_CAP_LINK};
static int32_t g_rank = -1;

/* ------------------------------------------------------------------------------------------ */
/* real functions */

typedef void *(*dlvsym_fn)(void *handle, const char *symbol, const char *version);
static _Atomic(ibv_open_device_fn) g_real_open;
static _Atomic(ibv_close_device_fn) g_real_close;
static _Atomic(ibv_create_qp_fn) g_real_create_qp;
static _Atomic(ibv_destroy_qp_fn) g_real_destroy_qp;

FS_EXPORT struct ibv_context *ibv_open_device(struct ibv_device *device);
FS_EXPORT int ibv_close_device(struct ibv_context *context);
FS_EXPORT struct ibv_qp *ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *attr);
FS_EXPORT int ibv_destroy_qp(struct ibv_qp *qp);

/*
 * dlvsym interposition. glibc's dlvsym looks at its caller's return address for RTLD_NEXT
 * (and for the namespace of RTLD_DEFAULT), so lookups with those pseudo-handles must reach it
 * with the original caller's return address: on x86-64 the exported `dlvsym` is a small
 * assembly trampoline that *jumps* to glibc for them (sanitizer runtimes, for instance, resolve
 * their interceptors this way before any instrumented code may run) and to the C wrapper
 * fs_dlvsym_handle for real library handles -- the way NCCL resolves libibverbs.
 */
__attribute__((visibility("hidden"))) void *fs_real_dlvsym_raw; /* read by the trampoline */

static void *null_dlvsym(void *h, const char *s, const char *v) {
  (void)h, (void)s, (void)v;
  return NULL;
}

__attribute__((visibility("hidden"), no_sanitize_address, no_sanitize_thread,
               no_sanitize_undefined)) void *fs_resolve_dlvsym(void) {
  void *f = __atomic_load_n(&fs_real_dlvsym_raw, __ATOMIC_ACQUIRE);
  if (!f) {
    f = dlsym(RTLD_NEXT, "dlvsym");
    if (!f) f = (void *)null_dlvsym;
    __atomic_store_n(&fs_real_dlvsym_raw, f, __ATOMIC_RELEASE);
  }
  return f;
}

__attribute__((visibility("hidden"))) void *fs_dlvsym_handle(void *handle, const char *symbol,
                                                             const char *version);

#if defined(__x86_64__)
__asm__(
    ".text\n"
    ".globl dlvsym\n"
    ".type dlvsym, @function\n"
    "dlvsym:\n"
    "  cmpq $-1, %rdi\n" /* RTLD_NEXT */
    "  je 1f\n"
    "  testq %rdi, %rdi\n" /* RTLD_DEFAULT */
    "  je 1f\n"
    "  jmp fs_dlvsym_handle\n"
    "1:\n"
    "  movq fs_real_dlvsym_raw(%rip), %rax\n"
    "  testq %rax, %rax\n"
    "  jz 2f\n"
    "  jmp *%rax\n"
    "2:\n"
    "  pushq %rdi\n"
    "  pushq %rsi\n"
    "  pushq %rdx\n"
    "  call fs_resolve_dlvsym\n"
    "  popq %rdx\n"
    "  popq %rsi\n"
    "  popq %rdi\n"
    "  jmp *%rax\n"
    ".size dlvsym, .-dlvsym\n");
#else
/* Other architectures: a plain C wrapper (RTLD_NEXT lookups through it resolve relative to
 * the shim -- a documented limitation). */
FS_EXPORT void *dlvsym(void *handle, const char *symbol, const char *version) {
  return fs_dlvsym_handle(handle, symbol, version);
}
#endif

static dlvsym_fn real_dlvsym(void) { return (dlvsym_fn)fs_resolve_dlvsym(); }

/* The real ibv_* function: the one found through dlvsym, else the next definition. */
#define REAL_FN(var, type, name)                                                   \
  static type real_##name(void) {                                                  \
    type f = atomic_load_explicit(&var, FS_ACQ);                                      \
    if (!f) {                                                                      \
      f = (type)dlsym(RTLD_NEXT, #name);                                           \
      if ((void *)f == (void *)&name) f = NULL;                                    \
      if (f) atomic_store_explicit(&var, f, FS_REL);                                  \
    }                                                                              \
    return f;                                                                      \
  }
REAL_FN(g_real_open, ibv_open_device_fn, ibv_open_device)
REAL_FN(g_real_close, ibv_close_device_fn, ibv_close_device)
REAL_FN(g_real_create_qp, ibv_create_qp_fn, ibv_create_qp)
REAL_FN(g_real_destroy_qp, ibv_destroy_qp_fn, ibv_destroy_qp)

__attribute__((visibility("hidden"))) void *fs_dlvsym_handle(void *handle, const char *symbol,
                                                             const char *version) {
  void *p = real_dlvsym()(handle, symbol, version);
  if (!p || strncmp(symbol, "ibv_", 4) != 0) return p;
  if (!strcmp(symbol, "ibv_open_device")) {
    ibv_open_device_fn expected = NULL;
    atomic_compare_exchange_strong(&g_real_open, &expected, (ibv_open_device_fn)p);
    return (void *)&ibv_open_device;
  }
  if (!strcmp(symbol, "ibv_close_device")) {
    ibv_close_device_fn expected = NULL;
    atomic_compare_exchange_strong(&g_real_close, &expected, (ibv_close_device_fn)p);
    return (void *)&ibv_close_device;
  }
  if (!strcmp(symbol, "ibv_create_qp")) {
    ibv_create_qp_fn expected = NULL;
    atomic_compare_exchange_strong(&g_real_create_qp, &expected, (ibv_create_qp_fn)p);
    return (void *)&ibv_create_qp;
  }
  if (!strcmp(symbol, "ibv_destroy_qp")) {
    ibv_destroy_qp_fn expected = NULL;
    atomic_compare_exchange_strong(&g_real_destroy_qp, &expected, (ibv_destroy_qp_fn)p);
    return (void *)&ibv_destroy_qp;
  }
  return p;
}

/* ------------------------------------------------------------------------------------------ */
/* contexts (devices) */

#define MAX_CTX 64
struct ctx_entry {
  _Atomic(struct ibv_context *) ctx; /* NULL: free slot */
  ibv_post_send_fn post_send;
  ibv_poll_cq_fn poll_cq;
  char name[16];
  int closed;
  /* counts of destroyed queue pairs (folded under g_mu) */
  uint64_t r_posted, r_completed, r_bytes_posted, r_bytes, r_recv;
};
static struct ctx_entry g_ctx[MAX_CTX];
static _Atomic int g_nctx;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;

static inline int ctx_index(const struct ibv_context *c) {
  int n = atomic_load_explicit(&g_nctx, FS_ACQ);
  for (int i = 0; i < n; i++)
    if (atomic_load_explicit(&g_ctx[i].ctx, FS_RLX) == c) return i;
  return -1;
}

/* ------------------------------------------------------------------------------------------ */
/* queue pairs: open addressing keyed by (context index + 1) << 32 | qp_num */

#define QP_SLOTS 8192u
#define MARKS_MIN 64u
#define MARKS_MAX 65536u

/* cumulative (WRs, bytes) posted up to and including one signaled WR */
struct mark {
  _Atomic uint64_t n, b;
};

struct qp_entry {
  _Atomic uint64_t key;
  _Atomic int sig_all;
  _Atomic int approx; /* no or lost marks: completions are counted one by one */
  _Atomic int dead;
  _Atomic uint64_t posted, completed, bytes_posted, bytes, recv, recv_bytes, errors;
  _Atomic uint64_t mark_head, mark_tail;
  _Atomic(struct mark *) marks; /* allocated at ibv_create_qp; NULL: approximate mode */
  uint64_t marks_mask;
};
static struct qp_entry g_qp[QP_SLOTS];

static inline uint32_t qp_hash(uint64_t key) {
  return (uint32_t)((key * 0x9E3779B97F4A7C15ULL) >> 51) & (QP_SLOTS - 1);
}

static inline uint64_t qp_key(int ci, uint32_t qp_num) {
  return ((uint64_t)(ci + 1) << 32) | qp_num;
}

/* Find, or insert (lock-free) when `create`. */
static struct qp_entry *qp_lookup(uint64_t key, int create) {
  uint32_t i = qp_hash(key);
  for (uint32_t n = 0; n < QP_SLOTS; n++, i = (i + 1) & (QP_SLOTS - 1)) {
    uint64_t k = atomic_load_explicit(&g_qp[i].key, FS_ACQ);
    if (k == key) return &g_qp[i];
    if (k == 0) {
      if (!create) return NULL;
      uint64_t expected = 0;
      if (atomic_compare_exchange_strong_explicit(&g_qp[i].key, &expected, key, memory_order_acq_rel,
                                                  FS_ACQ))
        return &g_qp[i];
      if (expected == key) return &g_qp[i];
    }
  }
  return NULL;
}

/* Under g_mu, at queue-pair creation: signaled WRs outstanding from our point of view (posted,
 * not yet polled) are bounded by the send queue depth plus the completion queue size. */
static void qp_reset(struct qp_entry *q, int sig_all, uint64_t bound) {
  uint64_t n = MARKS_MIN;
  while (n < bound && n < MARKS_MAX) n <<= 1;
  struct mark *old = atomic_load_explicit(&q->marks, FS_RLX);
  struct mark *m = (old && q->marks_mask + 1 == n) ? old : (struct mark *)calloc(n, sizeof(*m));
  if (old && old != m) free(old);
  q->marks_mask = m ? n - 1 : 0;
  atomic_store_explicit(&q->marks, m, FS_REL);
  atomic_store_explicit(&q->sig_all, sig_all, FS_RLX);
  atomic_store_explicit(&q->approx, m ? 0 : 1, FS_RLX);
  atomic_store_explicit(&q->posted, 0, FS_RLX);
  atomic_store_explicit(&q->completed, 0, FS_RLX);
  atomic_store_explicit(&q->bytes_posted, 0, FS_RLX);
  atomic_store_explicit(&q->bytes, 0, FS_RLX);
  atomic_store_explicit(&q->recv, 0, FS_RLX);
  atomic_store_explicit(&q->recv_bytes, 0, FS_RLX);
  atomic_store_explicit(&q->errors, 0, FS_RLX);
  atomic_store_explicit(&q->mark_head, 0, FS_RLX);
  atomic_store_explicit(&q->mark_tail, 0, FS_RLX);
  atomic_store_explicit(&q->dead, 0, FS_REL);
}

/* ------------------------------------------------------------------------------------------ */
/* hot path: the replaced ops */

static int fs_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr) {
  int ci = ctx_index(qp->context);
  if (FS_UNLIKELY(ci < 0)) return EINVAL;
  ibv_post_send_fn real = g_ctx[ci].post_send;
  struct qp_entry *q = qp_lookup(qp_key(ci, qp->qp_num), 1);
  if (FS_UNLIKELY(!q)) return real(qp, wr, bad_wr);
  uint64_t n = 0, b = 0;
  for (struct ibv_send_wr *w = wr; w; w = w->next) {
    n++;
    for (int s = 0; s < w->num_sge; s++) b += w->sg_list[s].length;
  }
  /* counted before the call: a completion can only follow the post */
  uint64_t base_n = atomic_fetch_add_explicit(&q->posted, n, FS_RLX);
  uint64_t base_b = atomic_fetch_add_explicit(&q->bytes_posted, b, FS_RLX);
  int sig_all = atomic_load_explicit(&q->sig_all, FS_RLX);
  struct mark *marks = atomic_load_explicit(&q->marks, FS_ACQ);
  uint64_t cn = base_n, cb = base_b;
  for (struct ibv_send_wr *w = wr; marks && w; w = w->next) {
    cn++;
    for (int s = 0; s < w->num_sge; s++) cb += w->sg_list[s].length;
    if (sig_all || (w->send_flags & IBV_SEND_SIGNALED)) {
      uint64_t t = atomic_load_explicit(&q->mark_tail, FS_RLX);
      if (t - atomic_load_explicit(&q->mark_head, FS_ACQ) > q->marks_mask) {
        atomic_store_explicit(&q->approx, 1, FS_RLX); /* cannot happen within the bound */
        continue;
      }
      atomic_store_explicit(&marks[t & q->marks_mask].n, cn, FS_RLX);
      atomic_store_explicit(&marks[t & q->marks_mask].b, cb, FS_RLX);
      atomic_store_explicit(&q->mark_tail, t + 1, FS_REL);
    }
  }
  int rc = real(qp, wr, bad_wr);
  if (FS_UNLIKELY(rc != 0)) {
    /* WRs from *bad_wr on were not posted: take them back and stop trusting the marks */
    uint64_t un = 0, ub = 0;
    int seen = 0;
    for (struct ibv_send_wr *w = wr; w; w = w->next) {
      if (bad_wr && w == *bad_wr) seen = 1;
      if (!seen) continue;
      un++;
      for (int s = 0; s < w->num_sge; s++) ub += w->sg_list[s].length;
    }
    atomic_fetch_sub_explicit(&q->posted, un, FS_RLX);
    atomic_fetch_sub_explicit(&q->bytes_posted, ub, FS_RLX);
    atomic_store_explicit(&q->approx, 1, FS_RLX);
  }
  return rc;
}

static int fs_poll_cq(struct ibv_cq *cq, int num_entries, struct ibv_wc *wc) {
  int ci = ctx_index(cq->context);
  if (FS_UNLIKELY(ci < 0)) return -1;
  int n = g_ctx[ci].poll_cq(cq, num_entries, wc);
  for (int i = 0; i < n; i++) {
    struct qp_entry *q = qp_lookup(qp_key(ci, wc[i].qp_num), 1);
    if (FS_UNLIKELY(!q)) continue;
    if (wc[i].status != IBV_WC_SUCCESS) atomic_fetch_add_explicit(&q->errors, 1, FS_RLX);
    if (wc[i].opcode & IBV_WC_RECV) {
      atomic_fetch_add_explicit(&q->recv, 1, FS_RLX);
      if (wc[i].status == IBV_WC_SUCCESS)
        atomic_fetch_add_explicit(&q->recv_bytes, wc[i].byte_len, FS_RLX);
      continue;
    }
    uint64_t h = atomic_load_explicit(&q->mark_head, FS_RLX);
    struct mark *marks = atomic_load_explicit(&q->marks, FS_ACQ);
    if (marks && !atomic_load_explicit(&q->approx, FS_RLX) &&
        h < atomic_load_explicit(&q->mark_tail, FS_ACQ)) {
      uint64_t mn = atomic_load_explicit(&marks[h & q->marks_mask].n, FS_RLX);
      uint64_t mb = atomic_load_explicit(&marks[h & q->marks_mask].b, FS_RLX);
      atomic_store_explicit(&q->mark_head, h + 1, FS_REL);
      atomic_store_explicit(&q->completed, mn, FS_RLX);
      atomic_store_explicit(&q->bytes, mb, FS_RLX);
    } else {
      atomic_fetch_add_explicit(&q->completed, 1, FS_RLX);
    }
  }
  return n;
}

/* ------------------------------------------------------------------------------------------ */
/* sampler */

static _Atomic int g_sampler_started;

static void write_link(struct fs_ring *r, int ci, const char *name, uint32_t qp_num, uint32_t flags,
                       uint64_t posted, uint64_t completed, uint64_t bytes_posted, uint64_t bytes,
                       uint64_t recv, int64_t now) {
  uint64_t idx;
  struct fs_record *d = fs_ring_reserve(r, &idx);
  if (!d) return;
  memset((char *)d + sizeof(uint64_t), 0, sizeof(*d) - sizeof(uint64_t));
  d->kind = FS_KIND_LINK;
  d->op = FS_OP_UNKNOWN;
  d->source = FS_SRC_VERBS;
  d->rank = g_rank;
  d->peer = -1;
  d->device = ci;
  d->t_ns = now;
  d->t_start_ns = FS_NULL_TIME;
  d->posted = posted;
  d->completed = completed;
  d->bytes = bytes;
  d->send_count = bytes_posted;
  d->recv_count = recv;
  d->flags = flags;
  d->qp_num = qp_num;
  memcpy(d->name, name, sizeof(d->name));
  fs_ring_commit(r, d, idx);
}

/* One LINK record per device (and per live queue pair in detail mode). */
static void sample_once(void) {
  struct fs_ring *r = fs_proc_ring_get(&g_ring);
  if (!r) return;
  uint32_t ctl = fs_ring_ctl(r);
  int64_t now = fs_now_ns();
  atomic_store_explicit(&r->hdr->heartbeat_ns, (uint64_t)now, FS_RLX);
  if (ctl & FS_CTL_PAUSE) return;
  pthread_mutex_lock(&g_mu);
  int nctx = atomic_load_explicit(&g_nctx, FS_ACQ);
  uint64_t p[MAX_CTX] = {0}, c[MAX_CTX] = {0}, bp[MAX_CTX] = {0}, b[MAX_CTX] = {0},
           rv[MAX_CTX] = {0};
  for (uint32_t i = 0; i < QP_SLOTS; i++) {
    uint64_t key = atomic_load_explicit(&g_qp[i].key, FS_ACQ);
    if (!key || atomic_load_explicit(&g_qp[i].dead, FS_ACQ)) continue;
    int ci = (int)(key >> 32) - 1;
    if (ci < 0 || ci >= nctx) continue;
    struct qp_entry *q = &g_qp[i];
    uint64_t qp_ = atomic_load_explicit(&q->posted, FS_RLX), qc = atomic_load_explicit(&q->completed, FS_RLX);
    uint64_t qbp = atomic_load_explicit(&q->bytes_posted, FS_RLX), qb = atomic_load_explicit(&q->bytes, FS_RLX);
    uint64_t qr = atomic_load_explicit(&q->recv, FS_RLX);
    p[ci] += qp_;
    c[ci] += qc;
    bp[ci] += qbp;
    b[ci] += qb;
    rv[ci] += qr;
    if (ctl & FS_CTL_DETAIL)
      write_link(r, ci, g_ctx[ci].name, (uint32_t)key, FS_FLAG_QP, qp_, qc, qbp, qb, qr, now);
  }
  for (int ci = 0; ci < nctx; ci++) {
    if (!atomic_load_explicit(&g_ctx[ci].ctx, FS_RLX)) continue;
    struct ctx_entry *e = &g_ctx[ci];
    write_link(r, ci, e->name, 0, 0, p[ci] + e->r_posted, c[ci] + e->r_completed,
               bp[ci] + e->r_bytes_posted, b[ci] + e->r_bytes, rv[ci] + e->r_recv, now);
  }
  pthread_mutex_unlock(&g_mu);
}

static void *sampler(void *arg) {
  (void)arg;
  int64_t ns = fs_env_ns("FAILSLOW_LINK_PERIOD_MS", 100, 1000000);
  if (ns < 1000000) ns = 1000000;
  struct timespec ts = {.tv_sec = ns / 1000000000, .tv_nsec = ns % 1000000000};
  for (;;) {
    nanosleep(&ts, NULL);
    sample_once();
  }
  return NULL;
}

/* the child of fork() has no sampler thread: it starts its own */
static void atfork_child(void) { atomic_store_explicit(&g_sampler_started, 0, FS_RLX); }

/* fork() while the sampler thread holds g_mu would leave it locked for good in the child (its
 * next ibv_open_device would wait forever): hold g_mu across fork(), as glibc does with its
 * malloc locks. No wrapper forks while it holds g_mu. */
static pthread_once_t g_fork_lock_once = PTHREAD_ONCE_INIT;
static void lock_for_fork(void) { pthread_mutex_lock(&g_mu); }
static void unlock_after_fork(void) { pthread_mutex_unlock(&g_mu); }
static void register_fork_lock(void) {
  pthread_atfork(lock_for_fork, unlock_after_fork, unlock_after_fork);
}

static void start_sampler(void) {
  fs_atfork_child(atfork_child);
  pthread_once(&g_fork_lock_once, register_fork_lock);
  int expected = 0;
  if (!atomic_compare_exchange_strong(&g_sampler_started, &expected, 1)) return;
  if (fs_env_ns("FAILSLOW_LINK_PERIOD_MS", 100, 1000000) <= 0) return; /* sampling disabled */
  if (fs_start_detached(sampler, NULL) != 0) atomic_store(&g_sampler_started, 0);
}

/* Exported for tests and the agent's on-demand sampling: write the LINK records now. */
FS_EXPORT void failslow_verbs_sample(void) { sample_once(); }

/* ------------------------------------------------------------------------------------------ */
/* wrappers of the resolved ibv_* functions */

FS_EXPORT struct ibv_context *ibv_open_device(struct ibv_device *device) {
  ibv_open_device_fn real = real_ibv_open_device();
  if (!real) {
    errno = ENOSYS;
    return NULL;
  }
  struct ibv_context *ctx = real(device);
  if (!ctx || fs_env_flag("FAILSLOW_DISABLE", 0)) return ctx;
  pthread_mutex_lock(&g_mu);
  int n = atomic_load_explicit(&g_nctx, FS_ACQ), ci = -1;
  for (int i = 0; i < n; i++)
    if (atomic_load_explicit(&g_ctx[i].ctx, FS_RLX) == ctx) ci = i;
  if (ci < 0 && n < MAX_CTX) {
    ci = n;
    struct ctx_entry *e = &g_ctx[ci];
    e->post_send = ctx->ops.post_send;
    e->poll_cq = ctx->ops.poll_cq;
    const char *nm = device ? device->name : "ibdev";
    size_t len = strnlen(nm, sizeof(e->name) - 1);
    memcpy(e->name, nm, len);
    e->name[len] = '\0';
    e->closed = 0;
    e->r_posted = e->r_completed = e->r_bytes_posted = e->r_bytes = e->r_recv = 0;
    atomic_store_explicit(&e->ctx, ctx, FS_REL);
    atomic_store_explicit(&g_nctx, n + 1, FS_REL);
    /* from here on the inline ibv_post_send / ibv_poll_cq of this context come to us */
    ctx->ops.post_send = fs_post_send;
    ctx->ops.poll_cq = fs_poll_cq;
  }
  pthread_mutex_unlock(&g_mu);
  if (ci >= 0) {
    if (g_rank < 0) g_rank = fs_env_rank();
    fs_proc_ring_get(&g_ring);
    start_sampler();
  }
  return ctx;
}

FS_EXPORT int ibv_close_device(struct ibv_context *context) {
  ibv_close_device_fn real = real_ibv_close_device();
  if (!real) return ENOSYS;
  pthread_mutex_lock(&g_mu);
  int ci = ctx_index(context);
  if (ci >= 0) {
    /* restore the provider's functions; keep the slot (its index names the device) */
    context->ops.post_send = g_ctx[ci].post_send;
    context->ops.poll_cq = g_ctx[ci].poll_cq;
    g_ctx[ci].closed = 1;
  }
  pthread_mutex_unlock(&g_mu);
  if (ci >= 0) sample_once(); /* last sample of the device */
  if (ci >= 0) {
    pthread_mutex_lock(&g_mu);
    atomic_store_explicit(&g_ctx[ci].ctx, (struct ibv_context *)NULL, FS_REL);
    pthread_mutex_unlock(&g_mu);
  }
  return real(context);
}

FS_EXPORT struct ibv_qp *ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *attr) {
  ibv_create_qp_fn real = real_ibv_create_qp();
  if (!real) {
    errno = ENOSYS;
    return NULL;
  }
  struct ibv_qp *qp = real(pd, attr);
  if (!qp) return qp;
  pthread_mutex_lock(&g_mu);
  int ci = ctx_index(qp->context);
  if (ci >= 0) {
    struct qp_entry *q = qp_lookup(qp_key(ci, qp->qp_num), 1);
    uint64_t bound = (attr ? attr->cap.max_send_wr : 0u) +
                     (qp->send_cq && qp->send_cq->cqe > 0 ? (uint64_t)qp->send_cq->cqe : 0u);
    if (q) qp_reset(q, attr ? attr->sq_sig_all != 0 : 0, bound);
  }
  pthread_mutex_unlock(&g_mu);
  return qp;
}

FS_EXPORT int ibv_destroy_qp(struct ibv_qp *qp) {
  ibv_destroy_qp_fn real = real_ibv_destroy_qp();
  if (!real) return ENOSYS;
  pthread_mutex_lock(&g_mu);
  int ci = qp ? ctx_index(qp->context) : -1;
  if (ci >= 0) {
    struct qp_entry *q = qp_lookup(qp_key(ci, qp->qp_num), 0);
    if (q && !atomic_load_explicit(&q->dead, FS_ACQ)) {
      /* fold into the device totals so the cumulative device counters never go down */
      struct ctx_entry *e = &g_ctx[ci];
      e->r_posted += atomic_load_explicit(&q->posted, FS_RLX);
      e->r_completed += atomic_load_explicit(&q->completed, FS_RLX);
      e->r_bytes_posted += atomic_load_explicit(&q->bytes_posted, FS_RLX);
      e->r_bytes += atomic_load_explicit(&q->bytes, FS_RLX);
      e->r_recv += atomic_load_explicit(&q->recv, FS_RLX);
      atomic_store_explicit(&q->dead, 1, FS_REL);
    }
  }
  pthread_mutex_unlock(&g_mu);
  return real(qp);
}

__attribute__((constructor)) static void fs_verbs_init(void) { g_rank = fs_env_rank(); }
__attribute__((destructor)) static void fs_verbs_fini(void) { fs_proc_ring_close(&g_ring); }
