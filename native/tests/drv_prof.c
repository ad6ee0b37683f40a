/*
 * drv_prof.c -- drives the profiler plugin the way NCCL does: dlopen, look up ncclProfiler_v5 /
 * ncclProfiler_v4, init per communicator, then API / task events on the calling thread and
 * ProxyOp / ProxyStep / NetPlugin / KernelCh events on a separate "proxy" thread.
 *
 *   drv_prof PLUGIN VERSION basic COMMID RANK   a scripted mix of operations (2 ranks)
 *   drv_prof PLUGIN VERSION pool N              N API-only operations (fills the op pool)
 *   drv_prof PLUGIN VERSION toggle              switch detail on through the ring control word
 * Prints one JSON object (activation masks seen) on stdout.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "failslow_ring.h"
#include "profiler_abi.h"

static ncclProfiler_v5_t *P5;
static ncclProfiler_v4_t *P4;
static int g_version;
static int g_mask;
static int g_rank;

struct sim_op {
  const char *func;
  size_t count;
  const char *dtype;
  int root, peer, is_p2p, nch;
  int nsend, nrecv, nsteps; /* proxy ops and steps per proxy op */
  int kernels;              /* KernelCh events (<= nch) */
  int children_before_stop; /* start the first kernel child before the task stop */
  void *api, *task;
};

/* ---------------------------------------------------------------- event helpers */

static void *start5(void *ctx, ncclProfilerEventDescr_v5_t *d) {
  void *h = NULL;
  d->rank = g_rank;
  P5->startEvent(ctx, &h, d);
  return h;
}

static void *start4(void *ctx, ncclProfilerEventDescr_v4_t *d) {
  void *h = NULL;
  d->rank = g_rank;
  P4->startEvent(ctx, &h, d);
  return h;
}

static void stop(void *h) {
  if (!h) return;
  if (P5) P5->stopEvent(h);
  else P4->stopEvent(h);
}

static void record(void *h, ncclProfilerEventState_t s, ncclProfilerEventStateArgs_v4_t *a) {
  if (!h) return;
  if (P5) P5->recordEventState(h, s, a);
  else P4->recordEventState(h, s, a);
}

static void *api_start(void *ctx, struct sim_op *op, void *group_api) {
  if (g_version < 5) return NULL;
  ncclProfilerEventDescr_v5_t d;
  memset(&d, 0, sizeof(d));
  d.parentObj = group_api;
  if (op->is_p2p) {
    d.type = ncclProfileP2pApi;
    d.p2pApi.func = op->func;
    d.p2pApi.count = op->count;
    d.p2pApi.datatype = op->dtype;
    d.p2pApi.stream = (void *)0x5000;
  } else {
    d.type = ncclProfileCollApi;
    d.collApi.func = op->func;
    d.collApi.count = op->count;
    d.collApi.datatype = op->dtype;
    d.collApi.root = op->root;
    d.collApi.stream = (void *)0x5000;
  }
  return start5(ctx, &d);
}

static void *task_start(void *ctx, struct sim_op *op, void *group) {
  if (g_version >= 5) {
    ncclProfilerEventDescr_v5_t d;
    memset(&d, 0, sizeof(d));
    d.parentObj = op->api;
    if (op->is_p2p) {
      d.type = ncclProfileP2p;
      d.p2p.func = op->func;
      d.p2p.count = op->count;
      d.p2p.datatype = op->dtype;
      d.p2p.peer = op->peer;
      d.p2p.nChannels = (uint8_t)op->nch;
      d.p2p.parentGroup = group;
    } else {
      d.type = ncclProfileColl;
      d.coll.func = op->func;
      d.coll.count = op->count;
      d.coll.datatype = op->dtype;
      d.coll.root = op->root;
      d.coll.nChannels = (uint8_t)op->nch;
      d.coll.algo = "Ring";
      d.coll.proto = "Simple";
      d.coll.parentGroup = group;
    }
    return start5(ctx, &d);
  }
  ncclProfilerEventDescr_v4_t d;
  memset(&d, 0, sizeof(d));
  d.parentObj = group;
  if (op->is_p2p) {
    d.type = ncclProfileP2p;
    d.p2p.func = op->func;
    d.p2p.count = op->count;
    d.p2p.datatype = op->dtype;
    d.p2p.peer = op->peer;
    d.p2p.nChannels = (uint8_t)op->nch;
  } else {
    d.type = ncclProfileColl;
    d.coll.func = op->func;
    d.coll.count = op->count;
    d.coll.datatype = op->dtype;
    d.coll.root = op->root;
    d.coll.nChannels = (uint8_t)op->nch;
    d.coll.algo = "Ring";
    d.coll.proto = "Simple";
  }
  return start4(ctx, &d);
}

static void *group_start(void *ctx, uint64_t type) {
  if (g_version >= 5) {
    ncclProfilerEventDescr_v5_t d;
    memset(&d, 0, sizeof(d));
    d.type = type;
    return start5(ctx, &d);
  }
  ncclProfilerEventDescr_v4_t d;
  memset(&d, 0, sizeof(d));
  d.type = (uint8_t)type;
  return start4(ctx, &d);
}

/* children, on the proxy thread */
static void *child5or4(void *ctx, uint64_t type, void *parent, int a, int b, int c) {
  if (g_version >= 5) {
    ncclProfilerEventDescr_v5_t d;
    memset(&d, 0, sizeof(d));
    d.type = type;
    d.parentObj = parent;
    if (type == ncclProfileProxyOp) {
      d.proxyOp.pid = getpid();
      d.proxyOp.channelId = (uint8_t)a;
      d.proxyOp.isSend = b;
      d.proxyOp.nSteps = c;
      d.proxyOp.peer = 1 - g_rank;
      d.proxyOp.chunkSize = 4096;
    } else if (type == ncclProfileProxyStep) {
      d.proxyStep.step = a;
    } else if (type == ncclProfileKernelCh) {
      d.kernelCh.channelId = (uint8_t)a;
      d.kernelCh.pTimer = 1000;
    }
    return start5(ctx, &d);
  }
  ncclProfilerEventDescr_v4_t d;
  memset(&d, 0, sizeof(d));
  d.type = (uint8_t)type;
  d.parentObj = parent;
  if (type == ncclProfileProxyOp) {
    d.proxyOp.pid = getpid();
    d.proxyOp.channelId = (uint8_t)a;
    d.proxyOp.isSend = b;
    d.proxyOp.nSteps = c;
    d.proxyOp.peer = 1 - g_rank;
  } else if (type == ncclProfileProxyStep) {
    d.proxyStep.step = a;
  } else if (type == ncclProfileKernelCh) {
    d.kernelCh.channelId = (uint8_t)a;
  }
  return start4(ctx, &d);
}

static void *net_start(void *ctx, void *parent, ncclProfilerNetIbDescr_v1_t *ib) {
  int64_t id = (int64_t)(NCCL_PROFILER_NET_TYPE_IB | NCCL_PROFILER_NET_IB_VER);
  if (g_version >= 5) {
    ncclProfilerEventDescr_v5_t d;
    memset(&d, 0, sizeof(d));
    d.type = ncclProfileNetPlugin;
    d.parentObj = parent;
    d.netPlugin.id = id;
    d.netPlugin.data = ib;
    return start5(ctx, &d);
  }
  ncclProfilerEventDescr_v4_t d;
  memset(&d, 0, sizeof(d));
  d.type = ncclProfileNetPlugin;
  d.parentObj = parent;
  d.netPlugin.id = id;
  d.netPlugin.data = ib;
  return start4(ctx, &d);
}

static void kernel(void *ctx, struct sim_op *op, int ch) {
  void *k = child5or4(ctx, ncclProfileKernelCh, op->task, ch, 0, 0);
  ncclProfilerEventStateArgs_v4_t a;
  memset(&a, 0, sizeof(a));
  a.kernelCh.pTimer = 2000;
  record(k, ncclProfilerKernelChStop, &a);
  stop(k);
}

static void run_children(void *ctx, struct sim_op *op, int skip_first_kernel) {
  for (int dir = 0; dir < 2; dir++) {
    int n = dir ? op->nsend : op->nrecv;
    for (int p = 0; p < n; p++) {
      void *po = child5or4(ctx, ncclProfileProxyOp, op->task, p, dir, op->nsteps);
      if (g_mask & ncclProfileProxyStep) {
        for (int s = 0; s < op->nsteps; s++) {
          void *st = child5or4(ctx, ncclProfileProxyStep, po, s, 0, 0);
          if (g_mask & ncclProfileNetPlugin) {
            ncclProfilerNetIbDescr_v1_t ib;
            memset(&ib, 0, sizeof(ib));
            ib.type = ncclProfileQp;
            ib.qp.device = 1;
            ib.qp.qpNum = 77;
            ib.qp.length = 4096;
            void *ne = net_start(ctx, st, &ib);
            stop(ne);
          }
          ncclProfilerEventStateArgs_v4_t a;
          memset(&a, 0, sizeof(a));
          a.proxyStep.transSize = 4096;
          record(st, dir ? ncclProfilerProxyStepSendWait : ncclProfilerProxyStepRecvWait, &a);
          stop(st);
        }
      }
      stop(po);
    }
  }
  for (int k = skip_first_kernel ? 1 : 0; k < op->kernels; k++) kernel(ctx, op, k);
}

/* ---------------------------------------------------------------- proxy thread */

#define QN 64
static struct {
  void *ctx;
  struct sim_op *op;
} g_q[QN];
static int g_qh, g_qt, g_qstop, g_qbusy;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cv = PTHREAD_COND_INITIALIZER;
static pthread_cond_t g_idle = PTHREAD_COND_INITIALIZER;

static void *proxy_thread(void *arg) {
  (void)arg;
  for (;;) {
    pthread_mutex_lock(&g_mu);
    while (g_qh == g_qt && !g_qstop) pthread_cond_wait(&g_cv, &g_mu);
    if (g_qh == g_qt && g_qstop) {
      pthread_mutex_unlock(&g_mu);
      return NULL;
    }
    void *ctx = g_q[g_qh % QN].ctx;
    struct sim_op *op = g_q[g_qh % QN].op;
    g_qh++;
    g_qbusy = 1;
    pthread_mutex_unlock(&g_mu);
    run_children(ctx, op, op->children_before_stop);
    pthread_mutex_lock(&g_mu);
    g_qbusy = 0;
    pthread_cond_broadcast(&g_idle);
    pthread_mutex_unlock(&g_mu);
  }
}

/* Operations of one communicator run in order on the device: before an operation's kernel can
 * start, the earlier ones have finished (their children have been reported). */
static void proxy_wait_idle(void) {
  pthread_mutex_lock(&g_mu);
  while (g_qh != g_qt || g_qbusy) pthread_cond_wait(&g_idle, &g_mu);
  pthread_mutex_unlock(&g_mu);
}

static void to_proxy(void *ctx, struct sim_op *op) {
  pthread_mutex_lock(&g_mu);
  g_q[g_qt % QN].ctx = ctx;
  g_q[g_qt % QN].op = op;
  g_qt++;
  pthread_cond_signal(&g_cv);
  pthread_mutex_unlock(&g_mu);
}

static void proxy_join(pthread_t t) {
  pthread_mutex_lock(&g_mu);
  g_qstop = 1;
  pthread_cond_signal(&g_cv);
  pthread_mutex_unlock(&g_mu);
  pthread_join(t, NULL);
}

/* ---------------------------------------------------------------- scenarios */

static void *init_comm(uint64_t comm, int nranks, int rank) {
  void *ctx = NULL;
  ncclResult_t r = P5 ? P5->init(&ctx, comm, &g_mask, "tp0", 1, nranks, rank, NULL)
                      : P4->init(&ctx, &g_mask, "tp0", comm, 1, nranks, rank, NULL);
  if (r != ncclSuccess) {
    fprintf(stderr, "init failed: %d\n", r);
    exit(3);
  }
  return ctx;
}

static void finalize(void *ctx) {
  if (P5) P5->finalize(ctx);
  else P4->finalize(ctx);
}

/* one "ncclGroupEnd": API events of ops[], then tasks started, stopped and handed to the proxy */
static void launch_group(void *ctx, struct sim_op **ops, int n, int with_children) {
  void *gapi = g_version >= 5 ? group_start(ctx, ncclProfileGroupApi) : NULL;
  for (int i = 0; i < n; i++) {
    ops[i]->api = api_start(ctx, ops[i], gapi);
    stop(ops[i]->api);
  }
  if (gapi) record(gapi, ncclProfilerGroupEndApiStart, NULL);
  void *group = group_start(ctx, ncclProfileGroup);
  for (int i = 0; i < n; i++) ops[i]->task = task_start(ctx, ops[i], group);
  for (int i = 0; i < n; i++)
    if (ops[i]->children_before_stop) {
      proxy_wait_idle();
      kernel(ctx, ops[i], 0);
    }
  for (int i = 0; i < n; i++) stop(ops[i]->task);
  if (with_children)
    for (int i = 0; i < n; i++) to_proxy(ctx, ops[i]);
  stop(group);
  stop(gapi);
}

static int basic(uint64_t comm) {
  pthread_t pt;
  pthread_create(&pt, NULL, proxy_thread, NULL);
  void *ctx = init_comm(comm, 2, g_rank);
  int mask0 = g_mask;
  static struct sim_op ar = {"AllReduce", 1000, "ncclFloat32", 0, -1, 0, 2, 2, 2, 4, 2, 0, 0, 0};
  static struct sim_op bc = {"Broadcast", 10, "ncclInt8", 1, -1, 0, 1, 0, 0, 0, 1, 1, 0, 0};
  static struct sim_op sd = {"Send", 64, "ncclFloat16", -1, 0, 1, 1, 1, 0, 3, 1, 0, 0, 0};
  static struct sim_op rv = {"Recv", 64, "ncclFloat16", -1, 0, 1, 1, 0, 1, 3, 1, 0, 0, 0};
  static struct sim_op ag = {"AllGather", 256, "ncclBfloat16", 0, -1, 0, 2, 0, 0, 0, 0, 0, 0, 0};
  static struct sim_op rs = {"ReduceScatter", 128, "ncclFloat64", 0, -1, 0, 1, 1, 1, 2, 1, 0, 0, 0};
  static struct sim_op aa = {"AllToAll", 4, "ncclFloat32", 0, -1, 0, 1, 1, 1, 1, 1, 0, 0, 0};
  sd.peer = rv.peer = 1 - g_rank;
  struct sim_op *g1[] = {&ar};
  struct sim_op *g2[] = {&bc};
  struct sim_op *g3[] = {&sd, &rv};
  struct sim_op *g4[] = {&ag}; /* no child events at all: its end is inferred */
  struct sim_op *g5[] = {&rs};
  struct sim_op *g6[] = {&aa};
  launch_group(ctx, g1, 1, 1);
  launch_group(ctx, g2, 1, 1);
  launch_group(ctx, g3, 2, 1);
  launch_group(ctx, g4, 1, 0);
  launch_group(ctx, g5, 1, 1);
  launch_group(ctx, g6, 1, 1);
  proxy_join(pt);
  finalize(ctx);
  printf("{\"mask\": %d}\n", mask0);
  return 0;
}

static int pool(int n) {
  void *ctx = init_comm(0x1234, 1, 0);
  struct sim_op op = {"AllReduce", 8, "ncclInt8", 0, -1, 0, 1, 0, 0, 0, 0, 0, 0, 0};
  for (int i = 0; i < n; i++) {
    op.api = api_start(ctx, &op, NULL);
    stop(op.api);
    if (g_version < 5) {
      op.task = task_start(ctx, &op, NULL);
      stop(op.task);
    }
  }
  finalize(ctx);
  printf("{\"mask\": %d}\n", g_mask);
  return 0;
}

static int toggle(void) {
  void *ctx = init_comm(0x99, 1, 0);
  int before = g_mask;
  char path[4096];
  const char *dir = getenv("FAILSLOW_RING_DIR");
  snprintf(path, sizeof(path), "%s/failslow-%s-%d-prof.ring", dir, getenv("FAILSLOW_JOB"),
           (int)getpid());
  struct fs_ring r;
  if (fs_ring_attach(&r, path) != 0) return 4;
  fs_ring_set_control(&r, FS_CTL_DETAIL);
  struct sim_op op = {"AllReduce", 8, "ncclInt8", 0, -1, 0, 1, 1, 0, 3, 1, 0, 0, 0};
  struct sim_op *g[] = {&op};
  launch_group(ctx, g, 1, 0);
  int after = g_mask;
  run_children(ctx, &op, 0);
  fs_ring_set_control(&r, FS_CTL_PAUSE);
  launch_group(ctx, g, 1, 0);
  int paused = g_mask;
  fs_ring_set_control(&r, 0);
  launch_group(ctx, g, 1, 0);
  run_children(ctx, &op, 0);
  fs_ring_detach(&r);
  finalize(ctx);
  printf("{\"before\": %d, \"after\": %d, \"paused\": %d, \"final\": %d}\n", before, after, paused,
         g_mask);
  return 0;
}

int main(int argc, char **argv) {
  if (argc < 4) return 2;
  void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    fprintf(stderr, "%s\n", dlerror());
    return 2;
  }
  g_version = atoi(argv[2]);
  if (g_version >= 5) P5 = (ncclProfiler_v5_t *)dlsym(lib, "ncclProfiler_v5");
  else P4 = (ncclProfiler_v4_t *)dlsym(lib, "ncclProfiler_v4");
  if (!P5 && !P4) return 2;
  int rc = 2;
  if (!strcmp(argv[3], "basic") && argc == 6) {
    g_rank = atoi(argv[5]);
    rc = basic(strtoull(argv[4], NULL, 0));
  } else if (!strcmp(argv[3], "pool") && argc == 5) {
    rc = pool(atoi(argv[4]));
  } else if (!strcmp(argv[3], "toggle")) {
    rc = toggle();
  }
  dlclose(lib);
  return rc;
}
