/*
 * profiler_abi_v6.h -- NCCL profiler plugin interface version 6 (NCCL 2.29+), written for
 * failslow from the layout of NCCL's plugin headers (plugin/profiler/profiler_v6.h of NCCL).
 *
 * v6 keeps the v5 callbacks and state arguments and adds copy-engine (CE) collectives: a
 * collective NCCL runs with cudaMemcpy-style copies instead of a kernel starts a CeColl event
 * (parent: the CollApi event), with CeSync and CeBatch children. All three are started and
 * stopped on the host while NCCL enqueues the copies: no event reports when the copies finish on
 * the device. The union members below must keep NCCL's order and types exactly.
 */
#ifndef FAILSLOW_PROFILER_ABI_V6_H
#define FAILSLOW_PROFILER_ABI_V6_H

#include "profiler_abi.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef ncclProfilerEventState_t ncclProfilerEventState_v6_t;
typedef ncclProfilerEventStateArgs_v4_t ncclProfilerEventStateArgs_v6_t;

typedef struct {
  uint64_t type;
  void *parentObj;
  int rank;
  union {
    struct { bool graphCaptured; int groupDepth; } groupApi;
    struct {
      const char *func;
      size_t count;
      const char *datatype;
      int root;
      void *stream;
      bool graphCaptured;
    } collApi;
    struct {
      const char *func;
      size_t count;
      const char *datatype;
      void *stream;
      bool graphCaptured;
    } p2pApi;
    struct { void *stream; } kernelLaunch;
    struct {
      uint64_t seqNumber;
      const char *func;
      void const *sendBuff;
      void *recvBuff;
      size_t count;
      int root;
      const char *datatype;
      uint8_t nChannels;
      uint8_t nWarps;
      const char *algo;
      const char *proto;
      void *parentGroup;
    } coll;
    struct {
      const char *func;
      void *buff;
      const char *datatype;
      size_t count;
      int peer;
      uint8_t nChannels;
      void *parentGroup;
    } p2p;
    struct { pid_t pid; uint8_t channelId; int peer; int nSteps; int chunkSize; int isSend; } proxyOp;
    struct { int step; } proxyStep;
    struct { uint8_t channelId; uint64_t pTimer; } kernelCh;
    struct { int64_t id; void *data; } netPlugin;
    /* new in v6 */
    struct {
      uint64_t seqNumber;
      const char *func;
      void const *sendBuff;
      void *recvBuff;
      size_t count;
      int root;
      const char *datatype;
      const char *syncStrategy; /* "MC" (multicast) or "UC" */
      bool intraBatchSync;
      uint32_t batchSize;
      uint32_t numBatches;
      uint32_t ceSeqNum;
      void *stream;
    } ceColl;
    struct { bool isComplete; int nRanks; } ceCollSync;
    struct { int numOps; size_t totalBytes; bool useIntraSync; } ceCollBatch;
  };
} ncclProfilerEventDescr_v6_t;

typedef struct {
  const char *name;
  ncclResult_t (*init)(void **context, uint64_t commId, int *eActivationMask,
                       const char *commName, int nNodes, int nranks, int rank,
                       ncclDebugLogger_t logfn);
  ncclResult_t (*startEvent)(void *context, void **eHandle, ncclProfilerEventDescr_v6_t *eDescr);
  ncclResult_t (*stopEvent)(void *eHandle);
  ncclResult_t (*recordEventState)(void *eHandle, ncclProfilerEventState_v6_t eState,
                                   ncclProfilerEventStateArgs_v6_t *eStateArgs);
  ncclResult_t (*finalize)(void *context);
} ncclProfiler_v6_t;

#if defined(__x86_64__) || defined(__aarch64__)
/* LP64 offsets (from the union start, byte 24) of the members the plugin reads. */
_Static_assert(offsetof(ncclProfilerEventDescr_v6_t, coll) == 24, "v6 union offset");
_Static_assert(offsetof(ncclProfilerEventDescr_v6_t, ceColl.datatype) == 24 + 48, "v6 ceColl");
_Static_assert(offsetof(ncclProfilerEventDescr_v6_t, ceColl.stream) == 24 + 80, "v6 ceColl");
_Static_assert(offsetof(ncclProfilerEventDescr_v6_t, ceCollBatch.totalBytes) == 24 + 8, "v6");
#endif

#ifdef __cplusplus
}
#endif
#endif
