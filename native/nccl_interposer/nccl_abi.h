/*
 * nccl_abi.h -- the subset of the public NCCL host API (nccl.h, NCCL 2.x) and CUDA runtime
 * types the interposer needs, declared from the public documentation so the interposer builds
 * without CUDA or NCCL headers. Types are ABI-identical to the real ones: opaque pointers,
 * int-sized enums, and the 128-byte ncclUniqueId passed by value.
 */
#ifndef FAILSLOW_NCCL_ABI_H
#define FAILSLOW_NCCL_ABI_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ncclComm *ncclComm_t;
typedef struct CUstream_st *cudaStream_t; /* same handle as the driver's CUstream */

#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
  char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
  ncclTimeout = 8 /* NCCL >= 2.28 */
} ncclResult_t;

typedef enum {
  ncclInt8 = 0,
  ncclUint8 = 1,
  ncclInt32 = 2,
  ncclUint32 = 3,
  ncclInt64 = 4,
  ncclUint64 = 5,
  ncclFloat16 = 6,
  ncclFloat32 = 7,
  ncclFloat64 = 8,
  ncclBfloat16 = 9,
  ncclFloat8e4m3 = 10,
  ncclFloat8e5m2 = 11,
  ncclNumTypes = 12
} ncclDataType_t;

typedef enum { ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3, ncclAvg = 4 } ncclRedOp_t;

/* Opaque here: the interposer only forwards the pointer. */
typedef struct ncclConfig_opaque ncclConfig_t;

/* CUDA runtime / driver entry points resolved at run time (never linked). */
typedef void (*fs_cuda_host_fn)(void *user_data);
typedef int (*fs_launch_host_func_t)(cudaStream_t stream, fs_cuda_host_fn fn, void *user_data);
typedef int (*fs_stream_is_capturing_t)(cudaStream_t stream, int *capture_status);

/* Signatures of the intercepted API. */
typedef ncclResult_t (*fs_nccl_init_rank_t)(ncclComm_t *comm, int nranks, ncclUniqueId id,
                                            int rank);
typedef ncclResult_t (*fs_nccl_init_rank_config_t)(ncclComm_t *comm, int nranks, ncclUniqueId id,
                                                   int rank, ncclConfig_t *config);
typedef ncclResult_t (*fs_nccl_init_rank_scalable_t)(ncclComm_t *comm, int nranks, int myrank,
                                                     int nId, ncclUniqueId *ids,
                                                     ncclConfig_t *config);
typedef ncclResult_t (*fs_nccl_init_all_t)(ncclComm_t *comms, int ndev, const int *devlist);
typedef ncclResult_t (*fs_nccl_split_t)(ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
                                        ncclConfig_t *config);
typedef ncclResult_t (*fs_nccl_comm_t)(ncclComm_t comm);
typedef ncclResult_t (*fs_nccl_comm_int_t)(const ncclComm_t comm, int *out);
typedef ncclResult_t (*fs_nccl_void_t)(void);
typedef ncclResult_t (*fs_nccl_allreduce_t)(const void *sendbuff, void *recvbuff, size_t count,
                                            ncclDataType_t datatype, ncclRedOp_t op,
                                            ncclComm_t comm, cudaStream_t stream);
typedef ncclResult_t (*fs_nccl_allgather_t)(const void *sendbuff, void *recvbuff,
                                            size_t sendcount, ncclDataType_t datatype,
                                            ncclComm_t comm, cudaStream_t stream);
typedef ncclResult_t (*fs_nccl_reducescatter_t)(const void *sendbuff, void *recvbuff,
                                                size_t recvcount, ncclDataType_t datatype,
                                                ncclRedOp_t op, ncclComm_t comm,
                                                cudaStream_t stream);
typedef ncclResult_t (*fs_nccl_broadcast_t)(const void *sendbuff, void *recvbuff, size_t count,
                                            ncclDataType_t datatype, int root, ncclComm_t comm,
                                            cudaStream_t stream);
typedef ncclResult_t (*fs_nccl_bcast_t)(void *buff, size_t count, ncclDataType_t datatype,
                                        int root, ncclComm_t comm, cudaStream_t stream);
typedef ncclResult_t (*fs_nccl_reduce_t)(const void *sendbuff, void *recvbuff, size_t count,
                                         ncclDataType_t datatype, ncclRedOp_t op, int root,
                                         ncclComm_t comm, cudaStream_t stream);
typedef ncclResult_t (*fs_nccl_alltoall_t)(const void *sendbuff, void *recvbuff, size_t count,
                                           ncclDataType_t datatype, ncclComm_t comm,
                                           cudaStream_t stream);
typedef ncclResult_t (*fs_nccl_send_t)(const void *sendbuff, size_t count,
                                       ncclDataType_t datatype, int peer, ncclComm_t comm,
                                       cudaStream_t stream);
typedef ncclResult_t (*fs_nccl_recv_t)(void *recvbuff, size_t count, ncclDataType_t datatype,
                                       int peer, ncclComm_t comm, cudaStream_t stream);

/* The API itself (as in nccl.h). */
ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId);
ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank);
ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank,
                                    ncclConfig_t *config);
ncclResult_t ncclCommInitRankScalable(ncclComm_t *newcomm, int nranks, int myrank, int nId,
                                      ncclUniqueId *commIds, ncclConfig_t *config);
ncclResult_t ncclCommInitAll(ncclComm_t *comm, int ndev, const int *devlist);
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
                           ncclConfig_t *config);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t ncclCommAbort(ncclComm_t comm);
ncclResult_t ncclCommCount(const ncclComm_t comm, int *count);
ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device);
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank);
ncclResult_t ncclGroupStart(void);
ncclResult_t ncclGroupEnd(void);
ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream);
ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream);
ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm,
                           cudaStream_t stream);
ncclResult_t ncclBcast(void *buff, size_t count, ncclDataType_t datatype, int root,
                       ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count,
                        ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm,
                        cudaStream_t stream);
ncclResult_t ncclAlltoAll(const void *sendbuff, void *recvbuff, size_t count,
                          ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclAllToAll(const void *sendbuff, void *recvbuff, size_t count,
                          ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif
