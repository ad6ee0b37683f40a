/*
 * plugin_core.h -- what plugin.c (the version-independent core, v4 and v5) shares with
 * plugin_v67.c (the v6 and v7 entry points). Internal: every name here has hidden visibility.
 */
#ifndef FAILSLOW_PLUGIN_CORE_H
#define FAILSLOW_PLUGIN_CORE_H

#include <stdint.h>
#include <sys/types.h>

#include "profiler_abi.h"
#include "profiler_abi_v6.h"
#include "profiler_abi_v7.h"

enum ev_type { EV_NONE = 0, EV_API, EV_TASK, EV_PROXYOP, EV_STEP, EV_KERNEL, EV_NET, EV_DUMMY };

/* First member of every event handle the plugin returns. */
struct fs_ev {
  uint8_t type;
};

struct fs_pctx;

/* What a task-level event (Coll, P2p, CeColl) says about its operation. */
struct task_info {
  uint8_t op;
  uint64_t bytes;
  int32_t peer;
  uint8_t nchannels; /* KernelCh events to expect (0: none, e.g. copy-engine collectives) */
};

extern struct fs_ev g_dummy; /* handle of events that are not tracked */
extern pid_t g_pid;

uint8_t op_code(const char *func);
uint64_t dtype_size(const char *datatype);

ncclResult_t init_common(void **context, int *mask, const char *name, uint64_t comm, int nnodes,
                         int nranks, int rank, int version);
ncclResult_t fs_finalize(void *context);
ncclResult_t fs_stop(void *handle);
ncclResult_t fs_record_state(void *handle, ncclProfilerEventState_t state,
                             ncclProfilerEventStateArgs_v4_t *args);

void *start_api(struct fs_pctx *ctx, int is_p2p, const char *func, size_t count,
                const char *datatype, int root, int graph);
void *start_task(struct fs_pctx *ctx, void *parent, const struct task_info *ti);
void *start_child(struct fs_pctx *ctx, uint8_t type, void *parent, pid_t pid, int is_send,
                  int nsteps);
void *start_step(struct fs_pctx *ctx, void *parent);
void *start_net(struct fs_pctx *ctx, int64_t id, void *data);
void *start_phase(void *parent, int phase_id);

#endif
