/*
 * stub_ibverbs.c -- a stand-in libibverbs.so.1 for tests, exporting the IBVERBS_1.1 versions of
 * the functions NCCL resolves with dlvsym (version node from stub_ibverbs.map), with the
 * rdma-core structure layouts of verbs_abi.h.
 * Two devices (mlx5_0, mlx5_1). The provider's post_send completes every signaled WR at once
 * (into the send CQ, in order); post_recv completes at once with byte_len = first SGE length.
 * A WR with wr_id == 0xBAD fails (EINVAL, *bad_wr set).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "verbs_abi.h"

#define API __attribute__((visibility("default")))

#define CQ_CAP 4096
struct stub_cq {
  struct ibv_cq cq;
  pthread_mutex_t mu;
  struct ibv_wc q[CQ_CAP];
  unsigned head, tail;
};

struct stub_qp {
  struct ibv_qp qp;
  int sig_all;
};

static struct ibv_device g_devs[2];
static struct ibv_device *g_list[3];
static _Atomic uint32_t g_qpn = 100;

static void cq_push(struct stub_cq *c, const struct ibv_wc *wc) {
  pthread_mutex_lock(&c->mu);
  if (c->tail - c->head < CQ_CAP) c->q[c->tail++ % CQ_CAP] = *wc;
  pthread_mutex_unlock(&c->mu);
}

static int stub_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad) {
  struct stub_qp *s = (struct stub_qp *)qp;
  for (struct ibv_send_wr *w = wr; w; w = w->next) {
    if (w->wr_id == 0xBAD) {
      if (bad) *bad = w;
      return EINVAL;
    }
    if (s->sig_all || (w->send_flags & IBV_SEND_SIGNALED)) {
      struct ibv_wc wc;
      memset(&wc, 0, sizeof(wc));
      wc.wr_id = w->wr_id;
      wc.status = IBV_WC_SUCCESS;
      wc.opcode = w->opcode == IBV_WR_SEND ? IBV_WC_SEND : IBV_WC_RDMA_WRITE;
      wc.qp_num = qp->qp_num;
      cq_push((struct stub_cq *)qp->send_cq, &wc);
    }
  }
  return 0;
}

static int stub_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad) {
  (void)bad;
  for (struct ibv_recv_wr *w = wr; w; w = w->next) {
    struct ibv_wc wc;
    memset(&wc, 0, sizeof(wc));
    wc.wr_id = w->wr_id;
    wc.status = IBV_WC_SUCCESS;
    wc.opcode = IBV_WC_RECV;
    wc.byte_len = w->num_sge > 0 ? w->sg_list[0].length : 0;
    wc.qp_num = qp->qp_num;
    cq_push((struct stub_cq *)qp->recv_cq, &wc);
  }
  return 0;
}

static int stub_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc) {
  struct stub_cq *c = (struct stub_cq *)cq;
  int k = 0;
  pthread_mutex_lock(&c->mu);
  while (k < n && c->head != c->tail) wc[k++] = c->q[c->head++ % CQ_CAP];
  pthread_mutex_unlock(&c->mu);
  return k;
}

API struct ibv_device **ibv_get_device_list(int *num) {
  strcpy(g_devs[0].name, "mlx5_0");
  strcpy(g_devs[1].name, "mlx5_1");
  g_list[0] = &g_devs[0];
  g_list[1] = &g_devs[1];
  g_list[2] = NULL;
  if (num) *num = 2;
  return g_list;
}
API void ibv_free_device_list(struct ibv_device **list) { (void)list; }
API const char *ibv_get_device_name(struct ibv_device *d) { return d->name; }

API struct ibv_context *ibv_open_device(struct ibv_device *d) {
  struct ibv_context *c = (struct ibv_context *)calloc(1, sizeof(*c));
  c->device = d;
  c->ops.post_send = stub_post_send;
  c->ops.post_recv = stub_post_recv;
  c->ops.poll_cq = stub_poll_cq;
  pthread_mutex_init(&c->mutex, NULL);
  return c;
}
API int ibv_close_device(struct ibv_context *c) {
  pthread_mutex_destroy(&c->mutex);
  free(c);
  return 0;
}
API struct ibv_pd *ibv_alloc_pd(struct ibv_context *c) {
  struct ibv_pd *pd = (struct ibv_pd *)calloc(1, sizeof(*pd));
  pd->context = c;
  return pd;
}
API int ibv_dealloc_pd(struct ibv_pd *pd) {
  free(pd);
  return 0;
}
API struct ibv_cq *ibv_create_cq(struct ibv_context *c, int cqe, void *ctx,
                                  struct ibv_comp_channel *ch, int vec) {
  (void)vec;
  struct stub_cq *s = (struct stub_cq *)calloc(1, sizeof(*s));
  s->cq.context = c;
  s->cq.cqe = cqe;
  s->cq.cq_context = ctx;
  s->cq.channel = ch;
  pthread_mutex_init(&s->mu, NULL);
  return &s->cq;
}
API int ibv_destroy_cq(struct ibv_cq *cq) {
  struct stub_cq *s = (struct stub_cq *)cq;
  pthread_mutex_destroy(&s->mu);
  free(s);
  return 0;
}
API struct ibv_qp *ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *a) {
  struct stub_qp *s = (struct stub_qp *)calloc(1, sizeof(*s));
  s->qp.context = pd->context;
  s->qp.pd = pd;
  s->qp.send_cq = a->send_cq;
  s->qp.recv_cq = a->recv_cq;
  s->qp.qp_num = atomic_fetch_add(&g_qpn, 1);
  s->sig_all = a->sq_sig_all;
  return &s->qp;
}
API int ibv_destroy_qp(struct ibv_qp *qp) {
  free(qp);
  return 0;
}

