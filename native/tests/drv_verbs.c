/*
 * drv_verbs.c -- uses the (stub) libibverbs the way NCCL does: dlopen("libibverbs.so.1") and
 * dlvsym(handle, "ibv_*", "IBVERBS_1.1"), then the inline post/poll path through ctx->ops.
 * Run with LD_PRELOAD=libfailslow_verbs.so.
 *
 *   drv_verbs dlvsym   10 chains of 4 RDMA writes x 1000 B (last one signaled), all polled;
 *                      2 more chains not polled (in flight); 3 receives; one failing post;
 *                      then a poster and a poller thread on one more queue pair.
 *   drv_verbs fork     opens a device, waits for its sampler's first sample, forks; the child
 *                      opens another device and posts until
 *                      its own sampler thread has sampled 8 times (its ring's heartbeat),
 *                      then exits without closing: its ring holds only what that thread
 *                      wrote (the parent's thread does not survive fork).
 * Prints one JSON object; the counts are checked against the ring by the test.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "failslow_ring.h"
#include "verbs_abi.h"

typedef struct ibv_device **(*get_list_fn)(int *);
typedef struct ibv_pd *(*alloc_pd_fn)(struct ibv_context *);
typedef struct ibv_cq *(*create_cq_fn)(struct ibv_context *, int, void *, struct ibv_comp_channel *, int);
typedef int (*destroy_cq_fn)(struct ibv_cq *);
typedef int (*dealloc_pd_fn)(struct ibv_pd *);

#define SYM(var, type, name)                                      \
  type var = (type)dlvsym(h, name, "IBVERBS_1.1");                \
  if (!var) {                                                     \
    fprintf(stderr, "dlvsym %s failed\n", name);                  \
    return 2;                                                     \
  }

/* verbs.h inline functions, as compiled into NCCL */
static inline int post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad) {
  return qp->context->ops.post_send(qp, wr, bad);
}
static inline int post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad) {
  return qp->context->ops.post_recv(qp, wr, bad);
}
static inline int poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc) {
  return cq->context->ops.poll_cq(cq, n, wc);
}

static int post_chain(struct ibv_qp *qp, int n, uint32_t len, uint64_t first_id) {
  struct ibv_sge sge[8];
  struct ibv_send_wr wr[8];
  memset(wr, 0, sizeof(wr));
  for (int i = 0; i < n; i++) {
    sge[i].addr = 0x1000;
    sge[i].length = len;
    sge[i].lkey = 1;
    wr[i].wr_id = first_id + (uint64_t)i;
    wr[i].sg_list = &sge[i];
    wr[i].num_sge = 1;
    wr[i].opcode = IBV_WR_RDMA_WRITE;
    wr[i].send_flags = (i == n - 1) ? IBV_SEND_SIGNALED : 0;
    wr[i].next = (i + 1 < n) ? &wr[i + 1] : NULL;
  }
  struct ibv_send_wr *bad = NULL;
  return post_send(qp, wr, &bad);
}

static int drain(struct ibv_cq *cq, int want) {
  struct ibv_wc wc[16];
  int got = 0;
  while (got < want) {
    int n = poll_cq(cq, want - got < 16 ? want - got : 16, wc);
    if (n < 0) return -1;
    got += n;
  }
  return got;
}

static struct ibv_qp *g_tqp;
static struct ibv_cq *g_tcq;
static _Atomic int g_posted_chains;
#define THREAD_CHAINS 200

static void *poster(void *arg) {
  (void)arg;
  for (int i = 0; i < THREAD_CHAINS; i++) {
    post_chain(g_tqp, 2, 100, 5000 + (uint64_t)i * 2);
    atomic_fetch_add(&g_posted_chains, 1);
  }
  return NULL;
}

static void *poller(void *arg) {
  (void)arg;
  struct ibv_wc wc[16];
  int got = 0;
  while (got < THREAD_CHAINS) {
    int n = poll_cq(g_tcq, THREAD_CHAINS - got < 16 ? THREAD_CHAINS - got : 16, wc);
    if (n > 0) got += n;
  }
  return NULL;
}

#define CHILD_SAMPLES 8

/* the ring header's heartbeat_ns of the ring file at path (0 while there is none) */
static uint64_t heartbeat(const char *path) {
  uint64_t hb = 0;
  int fd = open(path, O_RDONLY);
  if (fd < 0) return 0;
  if (pread(fd, &hb, sizeof(hb), (off_t)offsetof(struct fs_ring_header, heartbeat_ns)) !=
      (ssize_t)sizeof(hb))
    hb = 0;
  close(fd);
  return hb;
}

static int fork_mode(void *h) {
  SYM(get_list, get_list_fn, "ibv_get_device_list");
  SYM(open_dev, ibv_open_device_fn, "ibv_open_device");
  SYM(close_dev, ibv_close_device_fn, "ibv_close_device");
  SYM(alloc_pd, alloc_pd_fn, "ibv_alloc_pd");
  SYM(create_cq, create_cq_fn, "ibv_create_cq");
  SYM(create_qp, ibv_create_qp_fn, "ibv_create_qp");
  int n = 0;
  struct ibv_device **devs = get_list(&n);
  struct ibv_context *ctx = open_dev(devs[0]); /* the parent's sampler thread starts */
  /* fork only once that thread has sampled: gcc 12's ASan runtime does not hold its allocator
   * locks across fork(), so a thread still starting (ASan allocates its thread state) at
   * fork() would leave the child's allocator locked and the child's own sampler stuck. glibc's
   * malloc, which production uses, takes its locks across fork(). */
  char mine[4096];
  snprintf(mine, sizeof(mine), "%s/failslow-%s-%d-verbs.ring", getenv("FAILSLOW_RING_DIR"),
           getenv("FAILSLOW_JOB"), (int)getpid());
  for (int i = 0; i < 10000 && heartbeat(mine) == 0; i++) {
    struct timespec ts = {0, 3000000};
    nanosleep(&ts, NULL);
  }
  pid_t child = fork();
  if (child < 0) return 4;
  if (child == 0) {
    struct ibv_context *c2 = open_dev(devs[1]);
    struct ibv_pd *pd = alloc_pd(c2);
    struct ibv_cq *cq = create_cq(c2, 256, NULL, NULL, 0);
    struct ibv_qp_init_attr attr;
    memset(&attr, 0, sizeof(attr));
    attr.send_cq = cq;
    attr.recv_cq = cq;
    struct ibv_qp *qp = create_qp(pd, &attr);
    /* post until the child's own sampler thread has run CHILD_SAMPLES times (its ring's
     * heartbeat moves at every sample), however slowly it starts (a sanitizer, a busy
     * machine); give up after about 30 s, the test then fails on the count */
    char path[4096];
    snprintf(path, sizeof(path), "%s/failslow-%s-%d-verbs.ring", getenv("FAILSLOW_RING_DIR"),
             getenv("FAILSLOW_JOB"), (int)getpid());
    uint64_t last = 0;
    int beats = 0;
    for (int i = 0; i < 10000 && beats < CHILD_SAMPLES; i++) {
      post_chain(qp, 2, 64, (uint64_t)i * 2);
      if (drain(cq, 1) != 1) _exit(3);
      struct timespec ts = {0, 3000000};
      nanosleep(&ts, NULL);
      uint64_t hb = heartbeat(path);
      if (hb != last) {
        last = hb;
        beats++;
      }
    }
    _exit(0); /* no close: nothing but the child's own periodic samples */
  }
  int st = 0;
  waitpid(child, &st, 0);
  close_dev(ctx);
  printf("{\"child\": %d, \"child_status\": %d}\n", (int)child, st);
  return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : 5;
}

int main(int argc, char **argv) {
  if (argc < 2) return 2;
  if (!strcmp(argv[1], "fork")) {
    void *fh = dlopen("libibverbs.so.1", RTLD_NOW);
    return fh ? fork_mode(fh) : 2;
  }
  if (strcmp(argv[1], "dlvsym") != 0) return 2;
  void *h = dlopen("libibverbs.so.1", RTLD_NOW);
  if (!h) {
    fprintf(stderr, "%s\n", dlerror());
    return 2;
  }
  SYM(get_list, get_list_fn, "ibv_get_device_list");
  SYM(open_dev, ibv_open_device_fn, "ibv_open_device");
  SYM(close_dev, ibv_close_device_fn, "ibv_close_device");
  SYM(alloc_pd, alloc_pd_fn, "ibv_alloc_pd");
  SYM(dealloc_pd, dealloc_pd_fn, "ibv_dealloc_pd");
  SYM(create_cq, create_cq_fn, "ibv_create_cq");
  SYM(destroy_cq, destroy_cq_fn, "ibv_destroy_cq");
  SYM(create_qp, ibv_create_qp_fn, "ibv_create_qp");
  SYM(destroy_qp, ibv_destroy_qp_fn, "ibv_destroy_qp");
  void (*sample)(void) = (void (*)(void))dlsym(RTLD_DEFAULT, "failslow_verbs_sample");

  int n = 0;
  struct ibv_device **devs = get_list(&n);
  struct ibv_context *ctx = open_dev(devs[0]);
  struct ibv_pd *pd = alloc_pd(ctx);
  struct ibv_cq *cq = create_cq(ctx, 256, NULL, NULL, 0);
  struct ibv_qp_init_attr attr;
  memset(&attr, 0, sizeof(attr));
  attr.send_cq = cq;
  attr.recv_cq = cq;
  attr.sq_sig_all = 0;
  struct ibv_qp *qp = create_qp(pd, &attr);

  for (int i = 0; i < 10; i++) post_chain(qp, 4, 1000, (uint64_t)i * 4);
  if (drain(cq, 10) != 10) return 3;
  if (sample) sample(); /* A: posted 40, completed 40, bytes 40000 */

  post_chain(qp, 4, 1000, 100);
  post_chain(qp, 4, 1000, 104);
  if (sample) sample(); /* B: posted 48, completed 40 (8 in flight) */
  if (drain(cq, 2) != 2) return 3;

  struct ibv_sge rs = {0x2000, 512, 1};
  struct ibv_recv_wr rw[3];
  memset(rw, 0, sizeof(rw));
  for (int i = 0; i < 3; i++) {
    rw[i].wr_id = 900 + (uint64_t)i;
    rw[i].sg_list = &rs;
    rw[i].num_sge = 1;
    rw[i].next = i < 2 ? &rw[i + 1] : NULL;
  }
  struct ibv_recv_wr *rbad = NULL;
  post_recv(qp, rw, &rbad);
  if (drain(cq, 3) != 3) return 3;
  if (sample) sample(); /* C: posted 48, completed 48, bytes 48000, recv 3 */

  /* a failing post: the WR at 0xBAD and after are taken back */
  struct ibv_sge fs[2] = {{0x1000, 10, 1}, {0x1000, 10, 1}};
  struct ibv_send_wr fw[2];
  memset(fw, 0, sizeof(fw));
  fw[0].wr_id = 0xBAD;
  fw[0].sg_list = &fs[0];
  fw[0].num_sge = 1;
  fw[0].send_flags = IBV_SEND_SIGNALED;
  fw[0].next = &fw[1];
  fw[1].wr_id = 1;
  fw[1].sg_list = &fs[1];
  fw[1].num_sge = 1;
  struct ibv_send_wr *fbad = NULL;
  int rc = post_send(qp, fw, &fbad);

  /* a poster and a poller thread on a second queue pair (second device) */
  struct ibv_context *ctx2 = open_dev(devs[1]);
  struct ibv_pd *pd2 = alloc_pd(ctx2);
  g_tcq = create_cq(ctx2, 4096, NULL, NULL, 0);
  memset(&attr, 0, sizeof(attr));
  attr.send_cq = g_tcq;
  attr.recv_cq = g_tcq;
  attr.sq_sig_all = 1; /* every WR signaled */
  g_tqp = create_qp(pd2, &attr);
  pthread_t tp, tc;
  pthread_create(&tc, NULL, poller, NULL);
  pthread_create(&tp, NULL, poster, NULL);
  pthread_join(tp, NULL);
  /* 200 chains x 2 WRs, all signaled: 400 completions */
  pthread_join(tc, NULL);
  if (drain(g_tcq, 2 * THREAD_CHAINS - THREAD_CHAINS) != THREAD_CHAINS) return 3;
  if (sample) sample(); /* D */

  destroy_qp(g_tqp);
  destroy_qp(qp);
  if (sample) sample(); /* E: device totals unchanged after destroy */
  destroy_cq(g_tcq);
  dealloc_pd(pd2);
  close_dev(ctx2);
  destroy_cq(cq);
  dealloc_pd(pd);
  close_dev(ctx);
  printf("{\"devices\": %d, \"bad_rc\": %d, \"bad_is_first\": %d, \"sampler\": %d}\n", n, rc,
         fbad == &fw[0], sample != NULL);
  return 0;
}
