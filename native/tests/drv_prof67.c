/*
 * drv_prof67.c -- drives the profiler plugin through ncclProfiler_v6 / ncclProfiler_v7 the way
 * NCCL 2.29+ does, on one thread (device order is the call order here).
 *
 *   drv_prof67 PLUGIN VERSION ce     copy-engine collectives (v6+): an AllGather through the
 *                                    copy engines under its CollApi event (with CeSync and
 *                                    CeBatch children), a Broadcast CeColl without an API
 *                                    parent, each followed by a kernel AllReduce that completes
 *   drv_prof67 PLUGIN 7 phase        a symmetric-kernel AllReduce with KernelPhase events: the
 *                                    initial synchronisation waits PHASE_WAIT_US before the
 *                                    compute phase starts; then a kernel AllReduce without phases
 * Prints one JSON object: the activation mask and the host times (ns) the test compares with.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "failslow_ring.h"
#include "profiler_abi_v6.h"
#include "profiler_abi_v7.h"

#define PHASE_WAIT_US 2000

static ncclProfiler_v6_t *P6;
static ncclProfiler_v7_t *P7;
static int g_mask;

/* One descriptor type for both versions: v7's is a superset with the same leading layout for
 * every member this driver fills (checked by the _Static_asserts of the headers). */
typedef ncclProfilerEventDescr_v7_t descr_t;

static void *start(void *ctx, descr_t *d) {
  void *h = NULL;
  if (P7) P7->startEvent(ctx, &h, d);
  else {
    ncclProfilerEventDescr_v6_t d6;
    memset(&d6, 0, sizeof(d6));
    d6.type = d->type;
    d6.parentObj = d->parentObj;
    d6.rank = d->rank;
    switch (d->type) {
      case ncclProfileCollApi:
        d6.collApi.func = d->collApi.func;
        d6.collApi.count = d->collApi.count;
        d6.collApi.datatype = d->collApi.datatype;
        d6.collApi.root = d->collApi.root;
        break;
      case ncclProfileColl:
        d6.coll.func = d->coll.func;
        d6.coll.count = d->coll.count;
        d6.coll.datatype = d->coll.datatype;
        d6.coll.nChannels = d->coll.nChannels;
        break;
      case ncclProfileKernelCh:
        d6.kernelCh.channelId = d->kernelCh.channelId;
        break;
      case ncclProfileCeColl:
        d6.ceColl.func = d->ceColl.func;
        d6.ceColl.count = d->ceColl.count;
        d6.ceColl.datatype = d->ceColl.datatype;
        d6.ceColl.root = d->ceColl.root;
        d6.ceColl.syncStrategy = d->ceColl.syncStrategy;
        break;
      case ncclProfileCeSync:
        d6.ceCollSync.nRanks = d->ceCollSync.nRanks;
        break;
      case ncclProfileCeBatch:
        d6.ceCollBatch.numOps = d->ceCollBatch.numOps;
        d6.ceCollBatch.totalBytes = d->ceCollBatch.totalBytes;
        break;
      default:
        break;
    }
    P6->startEvent(ctx, &h, &d6);
  }
  return h;
}

static void stop(void *h) {
  if (!h) return;
  if (P7) P7->stopEvent(h);
  else P6->stopEvent(h);
}

static void record(void *h, ncclProfilerEventState_t s, uint64_t ptimer) {
  if (!h) return;
  if (P7) {
    ncclProfilerEventStateArgs_v7_t a;
    memset(&a, 0, sizeof(a));
    a.kernelCh.pTimer = ptimer;
    P7->recordEventState(h, s, &a);
  } else {
    ncclProfilerEventStateArgs_v6_t a;
    memset(&a, 0, sizeof(a));
    a.kernelCh.pTimer = ptimer;
    P6->recordEventState(h, s, &a);
  }
}

static void *coll_api(void *ctx, const char *func, size_t count, const char *dt, int root) {
  descr_t d;
  memset(&d, 0, sizeof(d));
  d.type = ncclProfileCollApi;
  d.collApi.func = func;
  d.collApi.count = count;
  d.collApi.datatype = dt;
  d.collApi.root = root;
  d.collApi.userTag = 42;
  return start(ctx, &d);
}

/* a kernel collective: task, one KernelCh child; returns after the child stopped */
static void kernel_coll(void *ctx, int sym) {
  void *api = coll_api(ctx, "AllReduce", 100, "ncclFloat32", 0);
  descr_t d;
  memset(&d, 0, sizeof(d));
  d.type = ncclProfileColl;
  d.parentObj = api;
  d.coll.func = "AllReduce";
  d.coll.count = 100;
  d.coll.datatype = "ncclFloat32";
  d.coll.nChannels = 1;
  d.coll.algo = "Ring";
  d.coll.proto = "Simple";
  d.coll.kernelVariant = sym ? "AllReduce_ST" : NULL;
  d.coll.isSymColl = sym != 0;
  d.coll.userTag = 42;
  void *task = start(ctx, &d);
  stop(task);
  stop(api);
  memset(&d, 0, sizeof(d));
  d.type = ncclProfileKernelCh;
  d.parentObj = task;
  void *k = start(ctx, &d);
  if (sym) {
    for (int phase = 0; phase < 3; phase++) {
      if (phase == FS_KPHASE_COMPUTE) printf("\"compute_after_ns\": %lld, ", (long long)fs_now_ns());
      memset(&d, 0, sizeof(d));
      d.type = ncclProfileKernelPhase;
      d.parentObj = k;
      d.kernelPhase.phaseId = (uint8_t)phase;
      d.kernelPhase.phaseName = phase == 0 ? "initial_sync" : phase == 1 ? "compute" : "final_sync";
      void *ph = start(ctx, &d);
      if (phase == FS_KPHASE_INITIAL_SYNC) usleep(PHASE_WAIT_US);
      record(ph, ncclProfilerKernelPhaseStop, 100);
      stop(ph);
    }
  }
  record(k, ncclProfilerKernelChStop, 200);
  stop(k);
}

/* a copy-engine collective; `with_api`: under its CollApi event, as NCCL does */
static void ce_coll(void *ctx, const char *func, size_t count, const char *dt, int root,
                    int with_api) {
  void *api = with_api ? coll_api(ctx, func, count, dt, root) : NULL;
  descr_t d;
  memset(&d, 0, sizeof(d));
  d.type = ncclProfileCeColl;
  d.parentObj = api;
  d.ceColl.func = func;
  d.ceColl.count = count;
  d.ceColl.datatype = dt;
  d.ceColl.root = root;
  d.ceColl.syncStrategy = "UC";
  void *ce = start(ctx, &d);
  memset(&d, 0, sizeof(d));
  d.type = ncclProfileCeSync;
  d.parentObj = ce;
  d.ceCollSync.nRanks = 2;
  stop(start(ctx, &d));
  memset(&d, 0, sizeof(d));
  d.type = ncclProfileCeBatch;
  d.parentObj = ce;
  d.ceCollBatch.numOps = 2;
  d.ceCollBatch.totalBytes = count;
  stop(start(ctx, &d));
  stop(ce);
  stop(api);
}

int main(int argc, char **argv) {
  if (argc < 4) return 2;
  void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    fprintf(stderr, "%s\n", dlerror());
    return 2;
  }
  int version = atoi(argv[2]);
  if (version == 7) P7 = (ncclProfiler_v7_t *)dlsym(lib, "ncclProfiler_v7");
  else if (version == 6) P6 = (ncclProfiler_v6_t *)dlsym(lib, "ncclProfiler_v6");
  if (!P6 && !P7) {
    fprintf(stderr, "ncclProfiler_v%d not exported\n", version);
    return 3;
  }
  void *ctx = NULL;
  ncclResult_t r = P7 ? P7->init(&ctx, 0xCE, &g_mask, "ce0", 1, 2, 0, NULL)
                      : P6->init(&ctx, 0xCE, &g_mask, "ce0", 1, 2, 0, NULL);
  if (r != ncclSuccess) return 4;
  printf("{");
  if (!strcmp(argv[3], "ce")) {
    ce_coll(ctx, "AllGather", 256, "ncclBfloat16", 0, 1);
    kernel_coll(ctx, 0);
    ce_coll(ctx, "Broadcast", 64, "ncclInt8", 1, 0);
    kernel_coll(ctx, 0);
  } else if (!strcmp(argv[3], "phase") && P7) {
    kernel_coll(ctx, 1);
    kernel_coll(ctx, 0);
  } else {
    return 2;
  }
  if (P7) P7->finalize(ctx);
  else P6->finalize(ctx);
  printf("\"mask\": %d}\n", g_mask);
  dlclose(lib);
  return 0;
}
