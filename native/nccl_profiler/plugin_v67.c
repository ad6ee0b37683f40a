/*
 * plugin_v67.c -- profiler API v6 and v7 entry points of the failslow plugin (the core is in
 * plugin.c). NCCL looks for the newest struct it knows: v7, then v6, v5, v4.
 *
 * v6: a copy-engine collective (CeColl) is an operation like a kernel collective, whose API
 *   event (CollApi) has already assigned seq and written the enter row. It has no kernel and no
 *   proxy children, and NCCL reports nothing when its copies finish on the device, so its `end`
 *   row is inferred (FS_FLAG_INFERRED_END) when a later operation of the communicator
 *   completes; stopping the CeColl event marks it launched, which makes that inference
 *   possible right away. CeSync and CeBatch children are host-side only and not tracked.
 * v7: descriptors gain userTag (not recorded: the event contract has no field for it) and
 *   kernel variant metadata; KernelPhase events give the transfer start (see start_phase).
 */
#define _GNU_SOURCE
#include <string.h>

#include "failslow_ring.h"
#include "plugin_core.h"

/* The descriptor members shared by v6 and v7 have the same names, so one body serves both. */
#define FS_START_V6PLUS(ctx, d, eHandle)                                                          \
  do {                                                                                            \
    struct task_info ti;                                                                          \
    switch ((d)->type) {                                                                          \
      case ncclProfileCollApi:                                                                    \
        *(eHandle) = start_api(ctx, 0, (d)->collApi.func, (d)->collApi.count,                     \
                               (d)->collApi.datatype, (d)->collApi.root, (d)->collApi.graphCaptured); \
        break;                                                                                    \
      case ncclProfileP2pApi:                                                                     \
        *(eHandle) = start_api(ctx, 1, (d)->p2pApi.func, (d)->p2pApi.count, (d)->p2pApi.datatype, \
                               -1, (d)->p2pApi.graphCaptured);                                    \
        break;                                                                                    \
      case ncclProfileColl:                                                                       \
        ti.op = op_code((d)->coll.func);                                                          \
        ti.bytes = (uint64_t)(d)->coll.count * dtype_size((d)->coll.datatype);                    \
        ti.peer = (ti.op == FS_OP_BROADCAST || ti.op == FS_OP_REDUCE) ? (d)->coll.root : -1;      \
        ti.nchannels = (d)->coll.nChannels;                                                       \
        *(eHandle) = start_task(ctx, (d)->parentObj, &ti);                                        \
        break;                                                                                    \
      case ncclProfileCeColl:                                                                     \
        ti.op = op_code((d)->ceColl.func);                                                        \
        ti.bytes = (uint64_t)(d)->ceColl.count * dtype_size((d)->ceColl.datatype);                \
        ti.peer = (ti.op == FS_OP_BROADCAST || ti.op == FS_OP_REDUCE) ? (d)->ceColl.root : -1;    \
        ti.nchannels = 0;                                                                         \
        *(eHandle) = start_task(ctx, (d)->parentObj, &ti);                                        \
        break;                                                                                    \
      case ncclProfileP2p:                                                                        \
        ti.op = op_code((d)->p2p.func);                                                           \
        ti.bytes = (uint64_t)(d)->p2p.count * dtype_size((d)->p2p.datatype);                      \
        ti.peer = (d)->p2p.peer;                                                                  \
        ti.nchannels = (d)->p2p.nChannels;                                                        \
        *(eHandle) = start_task(ctx, (d)->parentObj, &ti);                                        \
        break;                                                                                    \
      case ncclProfileProxyOp:                                                                    \
        *(eHandle) = start_child(ctx, EV_PROXYOP, (d)->parentObj, (d)->proxyOp.pid,               \
                                 (d)->proxyOp.isSend, (d)->proxyOp.nSteps);                       \
        break;                                                                                    \
      case ncclProfileKernelCh:                                                                   \
        *(eHandle) = start_child(ctx, EV_KERNEL, (d)->parentObj, g_pid, 0, 0);                    \
        break;                                                                                    \
      case ncclProfileProxyStep:                                                                  \
        *(eHandle) = start_step(ctx, (d)->parentObj);                                             \
        break;                                                                                    \
      case ncclProfileNetPlugin:                                                                  \
        *(eHandle) = start_net(ctx, (d)->netPlugin.id, (d)->netPlugin.data);                      \
        break;                                                                                    \
      default: /* Group, GroupApi, KernelLaunch, ProxyCtrl, CeSync, CeBatch: not tracked */       \
        *(eHandle) = &g_dummy;                                                                    \
        break;                                                                                    \
    }                                                                                             \
  } while (0)

static ncclResult_t fs_init_v6plus(void **context, uint64_t commId, int *eActivationMask,
                                   const char *commName, int nNodes, int nranks, int rank,
                                   ncclDebugLogger_t logfn, int version) {
  (void)logfn;
  return init_common(context, eActivationMask, commName, commId, nNodes, nranks, rank, version);
}

/* ---- v6 ---- */

static ncclResult_t fs_init_v6(void **context, uint64_t commId, int *eActivationMask,
                               const char *commName, int nNodes, int nranks, int rank,
                               ncclDebugLogger_t logfn) {
  return fs_init_v6plus(context, commId, eActivationMask, commName, nNodes, nranks, rank, logfn, 6);
}

static ncclResult_t fs_start_v6(void *context, void **eHandle, ncclProfilerEventDescr_v6_t *d) {
  struct fs_pctx *ctx = (struct fs_pctx *)context;
  *eHandle = NULL;
  if (!ctx || !d) return ncclSuccess;
  FS_START_V6PLUS(ctx, d, eHandle);
  return ncclSuccess;
}

static ncclResult_t fs_record_v6(void *h, ncclProfilerEventState_v6_t s,
                                 ncclProfilerEventStateArgs_v6_t *a) {
  return fs_record_state(h, s, a);
}

/* ---- v7 ---- */

static ncclResult_t fs_init_v7(void **context, uint64_t commId, int *eActivationMask,
                               const char *commName, int nNodes, int nranks, int rank,
                               ncclDebugLogger_t logfn) {
  return fs_init_v6plus(context, commId, eActivationMask, commName, nNodes, nranks, rank, logfn, 7);
}

static ncclResult_t fs_start_v7(void *context, void **eHandle, ncclProfilerEventDescr_v7_t *d) {
  struct fs_pctx *ctx = (struct fs_pctx *)context;
  *eHandle = NULL;
  if (!ctx || !d) return ncclSuccess;
  if (d->type == ncclProfileKernelPhase) {
    *eHandle = start_phase(d->parentObj, d->kernelPhase.phaseId);
    return ncclSuccess;
  }
  FS_START_V6PLUS(ctx, d, eHandle);
  return ncclSuccess;
}

static ncclResult_t fs_record_v7(void *h, ncclProfilerEventState_v7_t s,
                                 ncclProfilerEventStateArgs_v7_t *a) {
  (void)a; /* same shape as v4's; no state argument is used */
  return fs_record_state(h, s, NULL);
}

/* ---- exported structs ---- */

FS_EXPORT ncclProfiler_v7_t ncclProfiler_v7 = {
    .name = "failslow",
    .init = fs_init_v7,
    .startEvent = fs_start_v7,
    .stopEvent = fs_stop,
    .recordEventState = fs_record_v7,
    .finalize = fs_finalize,
};

FS_EXPORT ncclProfiler_v6_t ncclProfiler_v6 = {
    .name = "failslow",
    .init = fs_init_v6,
    .startEvent = fs_start_v6,
    .stopEvent = fs_stop,
    .recordEventState = fs_record_v6,
    .finalize = fs_finalize,
};
