/*
 * verbs_abi.h -- the part of the libibverbs ABI (rdma-core <infiniband/verbs.h>, x86-64 / glibc)
 * the verbs shim touches, declared from the public header so the shim builds without rdma-core.
 *
 * ibv_post_send / ibv_post_recv / ibv_poll_cq are static inline functions in verbs.h that call
 * through the context's ops table (qp->context->ops.post_send, cq->context->ops.poll_cq), so
 * they cannot be interposed as symbols: the shim replaces those function pointers in each
 * context it sees opened. The offsets asserted at the bottom are the ones of rdma-core's
 * structures on x86-64 Linux (pthread_mutex_t 40 bytes, pthread_cond_t 48 bytes).
 */
#ifndef FAILSLOW_VERBS_ABI_H
#define FAILSLOW_VERBS_ABI_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct ibv_context;
struct ibv_pd;
struct ibv_cq;
struct ibv_qp;
struct ibv_srq;
struct ibv_mw;
struct ibv_mr;
struct ibv_ah;
struct ibv_comp_channel;

enum { IBV_SYSFS_NAME_MAX = 64, IBV_SYSFS_PATH_MAX = 256 };

struct ibv_device {
  struct {
    void *_dummy1;
    void *_dummy2;
  } _ops;
  int node_type;      /* enum ibv_node_type */
  int transport_type; /* enum ibv_transport_type */
  char name[IBV_SYSFS_NAME_MAX];
  char dev_name[IBV_SYSFS_NAME_MAX];
  char dev_path[IBV_SYSFS_PATH_MAX];
  char ibdev_path[IBV_SYSFS_PATH_MAX];
};

struct ibv_sge {
  uint64_t addr;
  uint32_t length;
  uint32_t lkey;
};

enum ibv_wr_opcode {
  IBV_WR_RDMA_WRITE = 0,
  IBV_WR_RDMA_WRITE_WITH_IMM = 1,
  IBV_WR_SEND = 2,
  IBV_WR_SEND_WITH_IMM = 3,
  IBV_WR_RDMA_READ = 4,
};

enum ibv_send_flags {
  IBV_SEND_FENCE = 1 << 0,
  IBV_SEND_SIGNALED = 1 << 1,
  IBV_SEND_SOLICITED = 1 << 2,
  IBV_SEND_INLINE = 1 << 3,
};

struct ibv_mw_bind_info {
  struct ibv_mr *mr;
  uint64_t addr;
  uint64_t length;
  unsigned int mw_access_flags;
};

struct ibv_send_wr {
  uint64_t wr_id;
  struct ibv_send_wr *next;
  struct ibv_sge *sg_list;
  int num_sge;
  int opcode; /* enum ibv_wr_opcode */
  unsigned int send_flags;
  uint32_t imm_data;
  union {
    struct {
      uint64_t remote_addr;
      uint32_t rkey;
    } rdma;
    struct {
      uint64_t remote_addr;
      uint64_t compare_add;
      uint64_t swap;
      uint32_t rkey;
    } atomic;
    struct {
      struct ibv_ah *ah;
      uint32_t remote_qpn;
      uint32_t remote_qkey;
    } ud;
  } wr;
  union {
    struct {
      uint32_t remote_srqn;
    } xrc;
  } qp_type;
  union {
    struct {
      struct ibv_mw *mw;
      uint32_t rkey;
      struct ibv_mw_bind_info bind_info;
    } bind_mw;
    struct {
      void *hdr;
      uint16_t hdr_sz;
      uint16_t mss;
    } tso;
  };
};

struct ibv_recv_wr {
  uint64_t wr_id;
  struct ibv_recv_wr *next;
  struct ibv_sge *sg_list;
  int num_sge;
};

enum { IBV_WC_SUCCESS = 0 };
enum { IBV_WC_SEND = 0, IBV_WC_RDMA_WRITE = 1, IBV_WC_RDMA_READ = 2, IBV_WC_RECV = 1 << 7,
       IBV_WC_RECV_RDMA_WITH_IMM = (1 << 7) + 1 };

struct ibv_wc {
  uint64_t wr_id;
  int status; /* enum ibv_wc_status */
  int opcode; /* enum ibv_wc_opcode */
  uint32_t vendor_err;
  uint32_t byte_len;
  uint32_t imm_data;
  uint32_t qp_num;
  uint32_t src_qp;
  unsigned int wc_flags;
  uint16_t pkey_index;
  uint16_t slid;
  uint8_t sl;
  uint8_t dlid_path_bits;
};

typedef int (*ibv_poll_cq_fn)(struct ibv_cq *cq, int num_entries, struct ibv_wc *wc);
typedef int (*ibv_post_send_fn)(struct ibv_qp *qp, struct ibv_send_wr *wr,
                                struct ibv_send_wr **bad_wr);
typedef int (*ibv_post_recv_fn)(struct ibv_qp *qp, struct ibv_recv_wr *wr,
                                struct ibv_recv_wr **bad_wr);

struct ibv_context_ops {
  void *_compat_query_device;
  void *_compat_query_port;
  void *_compat_alloc_pd;
  void *_compat_dealloc_pd;
  void *_compat_reg_mr;
  void *_compat_rereg_mr;
  void *_compat_dereg_mr;
  void *alloc_mw;
  void *bind_mw;
  void *dealloc_mw;
  void *_compat_create_cq;
  ibv_poll_cq_fn poll_cq;
  void *req_notify_cq;
  void *_compat_cq_event;
  void *_compat_resize_cq;
  void *_compat_destroy_cq;
  void *_compat_create_srq;
  void *_compat_modify_srq;
  void *_compat_query_srq;
  void *_compat_destroy_srq;
  void *post_srq_recv;
  void *_compat_create_qp;
  void *_compat_query_qp;
  void *_compat_modify_qp;
  void *_compat_destroy_qp;
  ibv_post_send_fn post_send;
  ibv_post_recv_fn post_recv;
  void *_compat_create_ah;
  void *_compat_destroy_ah;
  void *_compat_attach_mcast;
  void *_compat_detach_mcast;
  void *_compat_async_event;
};

struct ibv_context {
  struct ibv_device *device;
  struct ibv_context_ops ops;
  int cmd_fd;
  int async_fd;
  int num_comp_vectors;
  pthread_mutex_t mutex;
  void *abi_compat;
};

struct ibv_pd {
  struct ibv_context *context;
  uint32_t handle;
};

struct ibv_cq {
  struct ibv_context *context;
  struct ibv_comp_channel *channel;
  void *cq_context;
  uint32_t handle;
  int cqe;
  pthread_mutex_t mutex;
  pthread_cond_t cond;
  uint32_t comp_events_completed;
  uint32_t async_events_completed;
};

struct ibv_qp {
  struct ibv_context *context;
  void *qp_context;
  struct ibv_pd *pd;
  struct ibv_cq *send_cq;
  struct ibv_cq *recv_cq;
  struct ibv_srq *srq;
  uint32_t handle;
  uint32_t qp_num;
  int state;   /* enum ibv_qp_state */
  int qp_type; /* enum ibv_qp_type */
  pthread_mutex_t mutex;
  pthread_cond_t cond;
  uint32_t events_completed;
};

struct ibv_qp_cap {
  uint32_t max_send_wr;
  uint32_t max_recv_wr;
  uint32_t max_send_sge;
  uint32_t max_recv_sge;
  uint32_t max_inline_data;
};

struct ibv_qp_init_attr {
  void *qp_context;
  struct ibv_cq *send_cq;
  struct ibv_cq *recv_cq;
  struct ibv_srq *srq;
  struct ibv_qp_cap cap;
  int qp_type;
  int sq_sig_all;
};

typedef struct ibv_context *(*ibv_open_device_fn)(struct ibv_device *device);
typedef int (*ibv_close_device_fn)(struct ibv_context *context);
typedef struct ibv_qp *(*ibv_create_qp_fn)(struct ibv_pd *pd, struct ibv_qp_init_attr *attr);
typedef int (*ibv_destroy_qp_fn)(struct ibv_qp *qp);

#if defined(__x86_64__) && defined(__linux__)
_Static_assert(offsetof(struct ibv_device, name) == 24, "ibv_device.name");
_Static_assert(offsetof(struct ibv_context_ops, poll_cq) == 88, "ops.poll_cq");
_Static_assert(offsetof(struct ibv_context_ops, post_send) == 200, "ops.post_send");
_Static_assert(offsetof(struct ibv_context_ops, post_recv) == 208, "ops.post_recv");
_Static_assert(sizeof(struct ibv_context_ops) == 256, "ibv_context_ops size");
_Static_assert(offsetof(struct ibv_context, ops) == 8, "ibv_context.ops");
_Static_assert(offsetof(struct ibv_context, abi_compat) == 320, "ibv_context.abi_compat");
_Static_assert(offsetof(struct ibv_qp, qp_num) == 52, "ibv_qp.qp_num");
_Static_assert(sizeof(struct ibv_qp) == 160, "ibv_qp size");
_Static_assert(sizeof(struct ibv_cq) == 128, "ibv_cq size");
_Static_assert(sizeof(struct ibv_wc) == 48, "ibv_wc size");
_Static_assert(offsetof(struct ibv_wc, qp_num) == 28, "ibv_wc.qp_num");
_Static_assert(offsetof(struct ibv_send_wr, send_flags) == 32, "ibv_send_wr.send_flags");
_Static_assert(offsetof(struct ibv_send_wr, wr) == 40, "ibv_send_wr.wr");
_Static_assert(sizeof(struct ibv_send_wr) == 128, "ibv_send_wr size");
_Static_assert(offsetof(struct ibv_qp_init_attr, sq_sig_all) == 56, "ibv_qp_init_attr");
#endif

#ifdef __cplusplus
}
#endif
#endif
