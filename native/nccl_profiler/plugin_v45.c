/*
 * plugin_v45.c -- profiler API v4 and v5 entry points of the failslow plugin (the core is in
 * plugin.c, v6/v7 in plugin_v67.c).
 */
#define _GNU_SOURCE
#include <string.h>

#include "failslow_ring.h"
#include "plugin_core.h"

static ncclResult_t fs_init_v5(void **context, uint64_t commId, int *eActivationMask,
                               const char *commName, int nNodes, int nranks, int rank,
                               ncclDebugLogger_t logfn) {
  (void)logfn;
  return init_common(context, eActivationMask, commName, commId, nNodes, nranks, rank, 5);
}

static ncclResult_t fs_init_v4(void **context, int *eActivationMask, const char *commName,
                               uint64_t commHash, int nNodes, int nranks, int rank,
                               ncclDebugLogger_t logfn) {
  (void)logfn;
  return init_common(context, eActivationMask, commName, commHash, nNodes, nranks, rank, 4);
}

/* ------------------------------------------------------------------------------------------ */
/* v5 */

static ncclResult_t fs_start_v5(void *context, void **eHandle, ncclProfilerEventDescr_v5_t *d) {
  struct fs_pctx *ctx = (struct fs_pctx *)context;
  *eHandle = NULL;
  if (!ctx || !d) return ncclSuccess;
  struct task_info ti;
  switch (d->type) {
    case ncclProfileCollApi:
      *eHandle = start_api(ctx, 0, d->collApi.func, d->collApi.count, d->collApi.datatype,
                           d->collApi.root, d->collApi.graphCaptured);
      break;
    case ncclProfileP2pApi:
      *eHandle = start_api(ctx, 1, d->p2pApi.func, d->p2pApi.count, d->p2pApi.datatype, -1,
                           d->p2pApi.graphCaptured);
      break;
    case ncclProfileColl:
      ti.op = op_code(d->coll.func);
      ti.bytes = (uint64_t)d->coll.count * dtype_size(d->coll.datatype);
      ti.peer = (ti.op == FS_OP_BROADCAST || ti.op == FS_OP_REDUCE) ? d->coll.root : -1;
      ti.nchannels = d->coll.nChannels;
      *eHandle = start_task(ctx, d->parentObj, &ti);
      break;
    case ncclProfileP2p:
      ti.op = op_code(d->p2p.func);
      ti.bytes = (uint64_t)d->p2p.count * dtype_size(d->p2p.datatype);
      ti.peer = d->p2p.peer;
      ti.nchannels = d->p2p.nChannels;
      *eHandle = start_task(ctx, d->parentObj, &ti);
      break;
    case ncclProfileProxyOp:
      *eHandle = start_child(ctx, EV_PROXYOP, d->parentObj, d->proxyOp.pid, d->proxyOp.isSend,
                             d->proxyOp.nSteps);
      break;
    case ncclProfileKernelCh:
      *eHandle = start_child(ctx, EV_KERNEL, d->parentObj, g_pid, 0, 0);
      break;
    case ncclProfileProxyStep:
      *eHandle = start_step(ctx, d->parentObj);
      break;
    case ncclProfileNetPlugin:
      *eHandle = start_net(ctx, d->netPlugin.id, d->netPlugin.data);
      break;
    default: /* Group, GroupApi, KernelLaunch, ProxyCtrl: not tracked */
      *eHandle = &g_dummy;
      break;
  }
  return ncclSuccess;
}

/* ------------------------------------------------------------------------------------------ */
/* v4 */

static ncclResult_t fs_start_v4(void *context, void **eHandle, ncclProfilerEventDescr_v4_t *d) {
  struct fs_pctx *ctx = (struct fs_pctx *)context;
  *eHandle = NULL;
  if (!ctx || !d) return ncclSuccess;
  struct task_info ti;
  switch (d->type) {
    case ncclProfileColl:
      ti.op = op_code(d->coll.func);
      ti.bytes = (uint64_t)d->coll.count * dtype_size(d->coll.datatype);
      ti.peer = (ti.op == FS_OP_BROADCAST || ti.op == FS_OP_REDUCE) ? d->coll.root : -1;
      ti.nchannels = d->coll.nChannels;
      *eHandle = start_task(ctx, d->parentObj, &ti);
      break;
    case ncclProfileP2p:
      ti.op = op_code(d->p2p.func);
      ti.bytes = (uint64_t)d->p2p.count * dtype_size(d->p2p.datatype);
      ti.peer = d->p2p.peer;
      ti.nchannels = d->p2p.nChannels;
      *eHandle = start_task(ctx, d->parentObj, &ti);
      break;
    case ncclProfileProxyOp:
      *eHandle = start_child(ctx, EV_PROXYOP, d->parentObj, d->proxyOp.pid, d->proxyOp.isSend,
                             d->proxyOp.nSteps);
      break;
    case ncclProfileKernelCh:
      *eHandle = start_child(ctx, EV_KERNEL, d->parentObj, g_pid, 0, 0);
      break;
    case ncclProfileProxyStep:
      *eHandle = start_step(ctx, d->parentObj);
      break;
    case ncclProfileNetPlugin:
      *eHandle = start_net(ctx, d->netPlugin.id, d->netPlugin.data);
      break;
    default:
      *eHandle = &g_dummy;
      break;
  }
  return ncclSuccess;
}

static ncclResult_t fs_record_v4(void *h, ncclProfilerEventState_v4_t s,
                                 ncclProfilerEventStateArgs_v4_t *a) {
  return fs_record_state(h, s, a);
}

/* ------------------------------------------------------------------------------------------ */
/* exported structs: NCCL looks up the newest version first */

FS_EXPORT ncclProfiler_v5_t ncclProfiler_v5 = {
    .name = "failslow",
    .init = fs_init_v5,
    .startEvent = fs_start_v5,
    .stopEvent = fs_stop,
    .recordEventState = fs_record_state,
    .finalize = fs_finalize,
};

FS_EXPORT ncclProfiler_v4_t ncclProfiler_v4 = {
    .name = "failslow",
    .init = fs_init_v4,
    .startEvent = fs_start_v4,
    .stopEvent = fs_stop,
    .recordEventState = fs_record_v4,
    .finalize = fs_finalize,
};

