/*
 * stub_nccl.c -- a stand-in libnccl.so.2 for tests: the real NCCL host API signatures
 * (nccl_abi.h), no devices. Collectives only count calls; a count of 0xBAD returns
 * ncclInvalidArgument so tests can exercise the error path.
 */
#define _GNU_SOURCE
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <time.h>

#include "nccl_abi.h"

#define API __attribute__((visibility("default")))
#define BAD_COUNT 0xBADu

struct ncclComm {
  int rank, nranks, dev;
};

static _Atomic long g_calls;
static __thread int t_depth;

API long stub_nccl_calls(void) { return atomic_load(&g_calls); }

API ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  unsigned long long x = (unsigned long long)ts.tv_nsec ^ ((unsigned long long)getpid() << 20);
  for (int i = 0; i < NCCL_UNIQUE_ID_BYTES; i++) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    id->internal[i] = (char)(x >> 56);
  }
  return ncclSuccess;
}

static ncclComm_t new_comm(int rank, int nranks) {
  ncclComm_t c = (ncclComm_t)calloc(1, sizeof(struct ncclComm));
  c->rank = rank;
  c->nranks = nranks;
  c->dev = rank % 8;
  return c;
}

API ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
  (void)id;
  if (!comm || rank < 0 || rank >= nranks) return ncclInvalidArgument;
  *comm = new_comm(rank, nranks);
  return ncclSuccess;
}

API ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank,
                                        ncclConfig_t *config) {
  (void)config;
  return ncclCommInitRank(comm, nranks, id, rank);
}

API ncclResult_t ncclCommInitRankScalable(ncclComm_t *comm, int nranks, int myrank, int nId,
                                          ncclUniqueId *ids, ncclConfig_t *config) {
  (void)nId;
  (void)ids;
  (void)config;
  if (!comm) return ncclInvalidArgument;
  *comm = new_comm(myrank, nranks);
  return ncclSuccess;
}

API ncclResult_t ncclCommInitAll(ncclComm_t *comms, int ndev, const int *devlist) {
  (void)devlist;
  for (int i = 0; i < ndev; i++) comms[i] = new_comm(i, ndev);
  return ncclSuccess;
}

/* new rank = key, size = STUB_SPLIT_SIZE (default: the parent's size) */
API ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
                               ncclConfig_t *config) {
  (void)config;
  if (!comm || !newcomm) return ncclInvalidArgument;
  if (color < 0) {
    *newcomm = NULL;
    return ncclSuccess;
  }
  const char *s = getenv("STUB_SPLIT_SIZE");
  int size = s ? atoi(s) : comm->nranks;
  *newcomm = new_comm(key, size);
  return ncclSuccess;
}

API ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  free(comm);
  return ncclSuccess;
}

API ncclResult_t ncclCommAbort(ncclComm_t comm) {
  free(comm);
  return ncclSuccess;
}

API ncclResult_t ncclCommCount(const ncclComm_t comm, int *count) {
  if (!comm) return ncclInvalidArgument;
  *count = comm->nranks;
  return ncclSuccess;
}

API ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank) {
  if (!comm) return ncclInvalidArgument;
  *rank = comm->rank;
  return ncclSuccess;
}

API ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device) {
  if (!comm) return ncclInvalidArgument;
  *device = comm->dev;
  return ncclSuccess;
}

API ncclResult_t ncclGroupStart(void) {
  t_depth++;
  return ncclSuccess;
}

API ncclResult_t ncclGroupEnd(void) {
  if (t_depth <= 0) return ncclInvalidUsage;
  t_depth--;
  return ncclSuccess;
}

static ncclResult_t op(ncclComm_t comm, size_t count) {
  atomic_fetch_add_explicit(&g_calls, 1, memory_order_relaxed);
  if (!comm) return ncclInvalidArgument;
  return count == BAD_COUNT ? ncclInvalidArgument : ncclSuccess;
}

API ncclResult_t ncclAllReduce(const void *s, void *r, size_t count, ncclDataType_t dt,
                               ncclRedOp_t o, ncclComm_t comm, cudaStream_t st) {
  (void)s, (void)r, (void)dt, (void)o, (void)st;
  return op(comm, count);
}
API ncclResult_t ncclAllGather(const void *s, void *r, size_t count, ncclDataType_t dt,
                               ncclComm_t comm, cudaStream_t st) {
  (void)s, (void)r, (void)dt, (void)st;
  return op(comm, count);
}
API ncclResult_t ncclReduceScatter(const void *s, void *r, size_t count, ncclDataType_t dt,
                                   ncclRedOp_t o, ncclComm_t comm, cudaStream_t st) {
  (void)s, (void)r, (void)dt, (void)o, (void)st;
  return op(comm, count);
}
API ncclResult_t ncclBroadcast(const void *s, void *r, size_t count, ncclDataType_t dt, int root,
                               ncclComm_t comm, cudaStream_t st) {
  (void)s, (void)r, (void)dt, (void)root, (void)st;
  return op(comm, count);
}
API ncclResult_t ncclBcast(void *b, size_t count, ncclDataType_t dt, int root, ncclComm_t comm,
                           cudaStream_t st) {
  (void)b, (void)dt, (void)root, (void)st;
  return op(comm, count);
}
API ncclResult_t ncclReduce(const void *s, void *r, size_t count, ncclDataType_t dt, ncclRedOp_t o,
                            int root, ncclComm_t comm, cudaStream_t st) {
  (void)s, (void)r, (void)dt, (void)o, (void)root, (void)st;
  return op(comm, count);
}
API ncclResult_t ncclAlltoAll(const void *s, void *r, size_t count, ncclDataType_t dt,
                              ncclComm_t comm, cudaStream_t st) {
  (void)s, (void)r, (void)dt, (void)st;
  return op(comm, count);
}
API ncclResult_t ncclSend(const void *s, size_t count, ncclDataType_t dt, int peer,
                          ncclComm_t comm, cudaStream_t st) {
  (void)s, (void)dt, (void)peer, (void)st;
  return op(comm, count);
}
API ncclResult_t ncclRecv(void *r, size_t count, ncclDataType_t dt, int peer, ncclComm_t comm,
                          cudaStream_t st) {
  (void)r, (void)dt, (void)peer, (void)st;
  return op(comm, count);
}
