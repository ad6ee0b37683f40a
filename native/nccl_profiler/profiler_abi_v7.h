/*
 * profiler_abi_v7.h -- NCCL profiler plugin interface version 7, written for failslow from the
 * layout of NCCL's plugin headers (plugin/profiler/profiler_v7.h of NCCL).
 *
 * Against v6, v7
 *  - appends `userTag` (uint64_t, 0 = untagged; set by the application per call) to the
 *    collApi, p2pApi, coll, p2p and ceColl descriptors, and `kernelVariant` / `isSymColl`
 *    (symmetric-memory kernel) before `userTag` in coll;
 *  - adds the KernelPhase event (child of a KernelCh event; only symmetric kernels emit it):
 *    phaseId 0 = initial synchronisation with the peers, 1 = compute (the data movement),
 *    2 = final synchronisation; stopped with state ncclProfilerKernelPhaseStop;
 *  - declares its own state-argument union, of the same shape as v4-v6.
 * Callbacks are those of v5/v6. The union members below must keep NCCL's order and types.
 */
#ifndef FAILSLOW_PROFILER_ABI_V7_H
#define FAILSLOW_PROFILER_ABI_V7_H

#include "profiler_abi.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef ncclProfilerEventState_t ncclProfilerEventState_v7_t;

typedef union {
  struct { size_t transSize; } proxyStep;
  struct { int appendedProxyOps; } proxyCtrl;
  struct { void *data; } netPlugin;
  struct { uint64_t pTimer; } kernelCh; /* KernelChStop and KernelPhaseStop */
} ncclProfilerEventStateArgs_v7_t;

enum { FS_KPHASE_INITIAL_SYNC = 0, FS_KPHASE_COMPUTE = 1, FS_KPHASE_FINAL_SYNC = 2 };

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
      uint64_t userTag;
    } collApi;
    struct {
      const char *func;
      size_t count;
      const char *datatype;
      void *stream;
      bool graphCaptured;
      uint64_t userTag;
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
      const char *kernelVariant;
      bool isSymColl;
      uint64_t userTag;
    } coll;
    struct {
      const char *func;
      void *buff;
      const char *datatype;
      size_t count;
      int peer;
      uint8_t nChannels;
      void *parentGroup;
      uint64_t userTag;
    } p2p;
    struct { pid_t pid; uint8_t channelId; int peer; int nSteps; int chunkSize; int isSend; } proxyOp;
    struct { int step; } proxyStep;
    struct { uint8_t channelId; uint64_t pTimer; } kernelCh;
    struct { int64_t id; void *data; } netPlugin;
    struct {
      uint64_t seqNumber;
      const char *func;
      void const *sendBuff;
      void *recvBuff;
      size_t count;
      int root;
      const char *datatype;
      const char *syncStrategy;
      bool intraBatchSync;
      uint32_t batchSize;
      uint32_t numBatches;
      uint32_t ceSeqNum;
      void *stream;
      uint64_t userTag;
    } ceColl;
    struct { bool isComplete; int nRanks; } ceCollSync;
    struct { int numOps; size_t totalBytes; bool useIntraSync; } ceCollBatch;
    /* new in v7 */
    struct {
      uint8_t channelId;
      uint8_t phaseId; /* FS_KPHASE_* */
      const char *phaseName;
      uint64_t pTimer; /* GPU global timer at the phase start */
    } kernelPhase;
  };
} ncclProfilerEventDescr_v7_t;

typedef struct {
  const char *name;
  ncclResult_t (*init)(void **context, uint64_t commId, int *eActivationMask,
                       const char *commName, int nNodes, int nranks, int rank,
                       ncclDebugLogger_t logfn);
  ncclResult_t (*startEvent)(void *context, void **eHandle, ncclProfilerEventDescr_v7_t *eDescr);
  ncclResult_t (*stopEvent)(void *eHandle);
  ncclResult_t (*recordEventState)(void *eHandle, ncclProfilerEventState_v7_t eState,
                                   ncclProfilerEventStateArgs_v7_t *eStateArgs);
  ncclResult_t (*finalize)(void *context);
} ncclProfiler_v7_t;

#if defined(__x86_64__) || defined(__aarch64__)
_Static_assert(offsetof(ncclProfilerEventDescr_v7_t, coll.kernelVariant) == 24 + 88, "v7 coll");
_Static_assert(offsetof(ncclProfilerEventDescr_v7_t, coll.userTag) == 24 + 104, "v7 coll");
_Static_assert(offsetof(ncclProfilerEventDescr_v7_t, collApi.userTag) == 24 + 48, "v7 collApi");
_Static_assert(offsetof(ncclProfilerEventDescr_v7_t, ceColl.userTag) == 24 + 88, "v7 ceColl");
_Static_assert(offsetof(ncclProfilerEventDescr_v7_t, kernelPhase.pTimer) == 24 + 16, "v7 phase");
#endif

#ifdef __cplusplus
}
#endif
#endif
