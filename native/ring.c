/*
 * ring.c -- creation, attachment and consumption of the failslow shared-memory ring, and the
 * lazily created per-process ring each collector library writes to.
 *
 * Nothing here runs on a hot path except through the inline functions of failslow_ring.h.
 * Each collector library compiles its own copy of this file with hidden visibility (so the
 * libraries do not depend on each other); libfailslow_ring.so exports it for the agent/tests.
 */
#define _GNU_SOURCE
#include "failslow_ring.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

FS_API uint64_t fs_pow2_clamp(uint64_t v, uint64_t lo, uint64_t hi) {
  if (v < lo) v = lo;
  if (v > hi) v = hi;
  uint64_t p = 1;
  while (p < v) p <<= 1;
  return p;
}

static void copy_str(char *dst, size_t cap, const char *src) {
  size_t n = src ? strlen(src) : 0;
  if (n >= cap) n = cap - 1;
  if (n) memcpy(dst, src, n);
  dst[n] = '\0';
}

FS_API int fs_ring_create(struct fs_ring *ring, const char *path, uint64_t capacity,
                          const struct fs_ring_meta *meta) {
  memset(ring, 0, sizeof(*ring));
  capacity = fs_pow2_clamp(capacity ? capacity : FS_DEFAULT_CAPACITY, FS_MIN_CAPACITY,
                           FS_MAX_CAPACITY);
  size_t size = FS_HEADER_SIZE + (size_t)capacity * FS_RECORD_SIZE;
  mode_t mode = (mode_t)fs_env_ll("FAILSLOW_RING_MODE", 0600);
  int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
  if (fd < 0) return -errno;
  if (ftruncate(fd, (off_t)size) != 0) {
    int e = errno;
    close(fd);
    unlink(path);
    return -e;
  }
  /* MAP_POPULATE: fault every page in now, so that the hot path never takes a page fault */
  void *base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  int e = errno;
  close(fd);
  if (base == MAP_FAILED) {
    unlink(path);
    return -e;
  }
  /* ftruncate gave zero-filled pages: all commit words are 0, no slot looks published. */
  struct fs_ring_header *h = (struct fs_ring_header *)base;
  h->version = FS_RING_VERSION;
  h->header_size = FS_HEADER_SIZE;
  h->record_size = FS_RECORD_SIZE;
  h->capacity = capacity;
  h->pid = (int32_t)getpid();
  h->rank = meta ? meta->rank : -1;
  h->local_rank = meta ? meta->local_rank : -1;
  h->world_size = meta ? meta->world_size : -1;
  h->collector = meta ? meta->collector : FS_SRC_UNKNOWN;
  h->caps = meta ? meta->caps : 0;
  h->created_ns = fs_now_ns();
  copy_str(h->job, sizeof(h->job), meta && meta->job ? meta->job : "default");
  char host[256];
  if (gethostname(host, sizeof(host)) != 0) host[0] = '\0';
  host[sizeof(host) - 1] = '\0';
  copy_str(h->host, sizeof(h->host), host);
  atomic_store_explicit(&h->write_idx, 0, memory_order_relaxed);
  atomic_store_explicit(&h->read_idx, 0, memory_order_relaxed);
  atomic_store_explicit(&h->dropped, 0, memory_order_relaxed);
  atomic_store_explicit(&h->pool_dropped, 0, memory_order_relaxed);
  atomic_store_explicit(&h->control, meta ? meta->control : 0, memory_order_relaxed);
  atomic_store_explicit(&h->closed, 0, memory_order_relaxed);
  atomic_store_explicit(&h->magic, FS_RING_MAGIC, memory_order_release);
  ring->hdr = h;
  ring->rec = (struct fs_record *)((char *)base + FS_HEADER_SIZE);
  ring->capacity = capacity;
  ring->mask = capacity - 1;
  ring->map_size = size;
  return 0;
}

FS_API int fs_ring_attach(struct fs_ring *ring, const char *path) {
  memset(ring, 0, sizeof(*ring));
  int fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) return -errno;
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int e = errno;
    close(fd);
    return -e;
  }
  if ((size_t)st.st_size < FS_HEADER_SIZE) {
    close(fd);
    return -EPROTO;
  }
  void *base = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int e = errno;
  close(fd);
  if (base == MAP_FAILED) return -e;
  struct fs_ring_header *h = (struct fs_ring_header *)base;
  uint64_t cap = h->capacity;
  int ok = atomic_load_explicit(&h->magic, memory_order_acquire) == FS_RING_MAGIC &&
           h->version == FS_RING_VERSION && h->header_size == FS_HEADER_SIZE &&
           h->record_size == FS_RECORD_SIZE && cap >= 1 && (cap & (cap - 1)) == 0 &&
           (size_t)st.st_size == FS_HEADER_SIZE + cap * FS_RECORD_SIZE;
  if (!ok) {
    munmap(base, (size_t)st.st_size);
    return -EPROTO;
  }
  ring->hdr = h;
  ring->rec = (struct fs_record *)((char *)base + FS_HEADER_SIZE);
  ring->capacity = cap;
  ring->mask = cap - 1;
  ring->map_size = (size_t)st.st_size;
  return 0;
}

FS_API void fs_ring_detach(struct fs_ring *ring) {
  if (ring->hdr) munmap(ring->hdr, ring->map_size);
  memset(ring, 0, sizeof(*ring));
}

FS_API size_t fs_ring_drain(struct fs_ring *ring, struct fs_record *out, size_t max) {
  struct fs_ring_header *h = ring->hdr;
  uint64_t r = atomic_load_explicit(&h->read_idx, memory_order_relaxed);
  size_t n = 0;
  while (n < max) {
    struct fs_record *slot = &ring->rec[(r + n) & ring->mask];
    if (atomic_load_explicit(&slot->commit, memory_order_acquire) != r + n + 1) break;
    memcpy((char *)&out[n] + sizeof(uint64_t), (const char *)slot + sizeof(uint64_t),
           sizeof(struct fs_record) - sizeof(uint64_t));
    atomic_store_explicit(&out[n].commit, r + n + 1, memory_order_relaxed);
    n++;
  }
  if (n) atomic_store_explicit(&h->read_idx, r + n, memory_order_release);
  return n;
}

FS_API void fs_fence_acquire(void) { atomic_thread_fence(memory_order_acquire); }

FS_API void fs_fence_release(void) { atomic_thread_fence(memory_order_release); }

FS_API void fs_ring_set_control(struct fs_ring *ring, uint32_t control) {
  atomic_store_explicit(&ring->hdr->control, control, memory_order_relaxed);
}

FS_API uint32_t fs_ring_control(const struct fs_ring *ring) { return fs_ring_ctl(ring); }

/* ------------------------------------------------------------------------------------------ */
/* environment */

FS_API long long fs_env_ll(const char *name, long long dflt) {
  const char *v = getenv(name);
  if (!v || !*v) return dflt;
  char *end = NULL;
  long long x = strtoll(v, &end, 0);
  return (end && *end == '\0') ? x : dflt;
}

FS_API int fs_env_flag(const char *name, int dflt) {
  const char *v = getenv(name);
  if (!v || !*v) return dflt;
  if (!strcmp(v, "0") || !strcasecmp(v, "false") || !strcasecmp(v, "no") || !strcasecmp(v, "off"))
    return 0;
  return 1;
}

FS_API uint64_t fs_env_pow2(const char *name, uint64_t dflt, uint64_t lo, uint64_t hi) {
  long long v = fs_env_ll(name, (long long)dflt);
  return fs_pow2_clamp(v > 0 ? (uint64_t)v : dflt, lo, hi);
}

FS_API int64_t fs_env_ns(const char *name, long long dflt, int64_t unit_ns) {
  return (int64_t)fs_env_ll(name, dflt) * unit_ns;
}

static int32_t env_first_int(const char *const *names, int32_t dflt) {
  for (; *names; names++) {
    long long v = fs_env_ll(*names, -1);
    if (v >= 0 && v <= INT32_MAX) return (int32_t)v;
  }
  return dflt;
}

FS_API int32_t fs_env_rank(void) {
  static const char *const names[] = {"FAILSLOW_RANK", "RANK", "OMPI_COMM_WORLD_RANK",
                                      "PMI_RANK", "SLURM_PROCID", NULL};
  return env_first_int(names, -1);
}

static int32_t env_local_rank(void) {
  static const char *const names[] = {"LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK",
                                      "SLURM_LOCALID", NULL};
  return env_first_int(names, -1);
}

static int32_t env_world_size(void) {
  static const char *const names[] = {"WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE",
                                      "SLURM_NTASKS", NULL};
  return env_first_int(names, -1);
}

/* Job id: FAILSLOW_JOB, else the launcher's run id; only [A-Za-z0-9._-], at most 64 chars. */
static void env_job(char *out, size_t cap) {
  static const char *const names[] = {"FAILSLOW_JOB", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID",
                                      NULL};
  const char *v = NULL;
  for (const char *const *n = names; *n && !v; n++) {
    const char *x = getenv(*n);
    if (x && *x) v = x;
  }
  if (!v) v = "default";
  size_t j = 0;
  for (size_t i = 0; v[i] && j + 1 < cap && j < 64; i++) {
    char c = v[i];
    int ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
             c == '.' || c == '_' || c == '-';
    out[j++] = ok ? c : '_';
  }
  if (j == 0) out[j++] = 'x';
  out[j] = '\0';
}

/* ------------------------------------------------------------------------------------------ */
/* process rings */

#define FS_MAX_PROC_RINGS 8
#define FS_MAX_ATFORK 8
static struct fs_proc_ring *g_proc_rings[FS_MAX_PROC_RINGS];
static _Atomic int g_nproc_rings;
static pthread_once_t g_atfork_once = PTHREAD_ONCE_INIT;
static void (*g_atfork_fns[FS_MAX_ATFORK])(void);
static _Atomic int g_natfork;
static pthread_mutex_t g_atfork_mu = PTHREAD_MUTEX_INITIALIZER;

/* Child of fork: forget the parent's ring; the child creates its own on its next record.
 * Then the collectors' own child handlers (fs_atfork_child). */
static void atfork_child(void) {
  pthread_mutex_init(&g_atfork_mu, NULL); /* a parent thread may have held it at fork() */
  int m = atomic_load_explicit(&g_natfork, memory_order_acquire);
  for (int i = 0; i < m; i++) g_atfork_fns[i]();
  int n = atomic_load_explicit(&g_nproc_rings, memory_order_acquire);
  for (int i = 0; i < n; i++) {
    struct fs_proc_ring *p = g_proc_rings[i];
    if (!p) continue;
    struct fs_ring *r = atomic_load_explicit(&p->ring, memory_order_acquire);
    atomic_store_explicit(&p->ring, NULL, memory_order_release);
    if (r && r->hdr) munmap(r->hdr, r->map_size);
    memset(&p->storage, 0, sizeof(p->storage));
    atomic_store_explicit(&p->state, 0, memory_order_release);
  }
}

static void register_atfork(void) { pthread_atfork(NULL, NULL, atfork_child); }

FS_API int fs_atfork_child(void (*fn)(void)) {
  pthread_once(&g_atfork_once, register_atfork);
  int rc = 0;
  pthread_mutex_lock(&g_atfork_mu);
  int n = atomic_load_explicit(&g_natfork, memory_order_relaxed), seen = 0;
  for (int i = 0; i < n; i++) seen |= g_atfork_fns[i] == fn;
  if (!seen && n < FS_MAX_ATFORK) {
    g_atfork_fns[n] = fn;
    atomic_store_explicit(&g_natfork, n + 1, memory_order_release);
  } else if (!seen) {
    rc = -1;
  }
  pthread_mutex_unlock(&g_atfork_mu);
  return rc;
}

FS_API int fs_start_detached(void *(*fn)(void *), void *arg) {
  pthread_t t;
  pthread_attr_t a;
  int rc = pthread_attr_init(&a);
  if (rc != 0) return rc;
  pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
  rc = pthread_create(&t, &a, fn, arg);
  pthread_attr_destroy(&a);
  return rc;
}

FS_API void *fs_dlopen_loaded(const char *env_name, const char *const *names) {
  const char *v = env_name ? getenv(env_name) : NULL;
  void *h = (v && *v) ? dlopen(v, RTLD_LAZY | RTLD_NOLOAD) : NULL;
  for (; !h && names && *names; names++) h = dlopen(*names, RTLD_LAZY | RTLD_NOLOAD);
  return h;
}

static void remember(struct fs_proc_ring *p) {
  int n = atomic_load_explicit(&g_nproc_rings, memory_order_acquire);
  for (int i = 0; i < n; i++)
    if (g_proc_rings[i] == p) return;
  if (n < FS_MAX_PROC_RINGS) {
    g_proc_rings[n] = p;
    atomic_store_explicit(&g_nproc_rings, n + 1, memory_order_release);
  }
}

FS_API struct fs_ring *fs_proc_ring_slow(struct fs_proc_ring *p) {
  int expected = 0;
  if (!atomic_compare_exchange_strong_explicit(&p->state, &expected, 1, memory_order_acq_rel,
                                               memory_order_acquire))
    return atomic_load_explicit(&p->ring, memory_order_acquire); /* creating/failed: NULL */
  pthread_once(&g_atfork_once, register_atfork);
  remember(p);
  if (fs_env_flag("FAILSLOW_DISABLE", 0)) {
    atomic_store_explicit(&p->state, 3, memory_order_release);
    return NULL;
  }
  char job[80];
  env_job(job, sizeof(job));
  const char *dir = getenv("FAILSLOW_RING_DIR");
  if (!dir || !*dir) dir = "/dev/shm";
  char path[4096];
  int n = snprintf(path, sizeof(path), "%s/failslow-%s-%d-%s.ring", dir, job, (int)getpid(),
                   p->tag ? p->tag : "ring");
  struct fs_ring_meta meta = {
      .job = job,
      .rank = fs_env_rank(),
      .local_rank = env_local_rank(),
      .world_size = env_world_size(),
      .collector = p->collector,
      .control = fs_env_flag("FAILSLOW_DETAIL", 0) ? FS_CTL_DETAIL : 0u,
      .caps = p->caps,
  };
  long long cap = fs_env_ll("FAILSLOW_RING_CAPACITY", FS_DEFAULT_CAPACITY);
  if (n <= 0 || (size_t)n >= sizeof(path) ||
      fs_ring_create(&p->storage, path, (uint64_t)(cap > 0 ? cap : FS_DEFAULT_CAPACITY), &meta) != 0) {
    if (fs_env_flag("FAILSLOW_VERBOSE", 0))
      fprintf(stderr, "failslow: cannot create ring %s: %s\n", path, strerror(errno));
    atomic_store_explicit(&p->state, 3, memory_order_release);
    return NULL;
  }
  atomic_store_explicit(&p->ring, &p->storage, memory_order_release);
  atomic_store_explicit(&p->state, 2, memory_order_release);
  return &p->storage;
}

FS_API void fs_proc_ring_close(struct fs_proc_ring *p) {
  /* Not unmapped: other threads (CUDA callbacks, proxy threads) may still write during exit. */
  struct fs_ring *r = atomic_load_explicit(&p->ring, memory_order_acquire);
  if (r && r->hdr) atomic_store_explicit(&r->hdr->closed, 1, memory_order_release);
}
