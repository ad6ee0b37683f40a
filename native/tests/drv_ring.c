/*
 * drv_ring.c -- test driver for the ring itself.
 *   drv_ring layout                     print offsets/sizes of the C structures (JSON)
 *   drv_ring stress PATH THREADS N CAP [fenced]
 *                                       THREADS producers x N records, one concurrent consumer;
 *                                       checks per-producer order, payloads, no loss except
 *                                       counted drops. `fenced`: the consumer follows the plain
 *                                       load + fence protocol of the Python reader instead of
 *                                       fs_ring_drain
 *   drv_ring full PATH N CAP            N records into a ring of CAP with no consumer
 *   drv_ring fork                       process ring (env), fork; parent and child each write 3
 *   drv_ring fill PATH N CAP            N COLL enter/end records with a known pattern
 * Output: one JSON object on stdout; exit status 0 on success.
 */
#define _GNU_SOURCE
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "failslow_ring.h"

#define OFF(T, f) printf("\"%s.%s\": [%zu, %zu], ", #T, #f, offsetof(struct T, f), sizeof(((struct T *)0)->f))

static int layout(void) {
  printf("{");
  OFF(fs_record, commit);
  OFF(fs_record, kind);
  OFF(fs_record, op);
  OFF(fs_record, phase);
  OFF(fs_record, source);
  OFF(fs_record, rank);
  OFF(fs_record, comm_rank);
  OFF(fs_record, comm_size);
  OFF(fs_record, peer);
  OFF(fs_record, device);
  OFF(fs_record, comm);
  OFF(fs_record, seq);
  OFF(fs_record, bytes);
  OFF(fs_record, t_ns);
  OFF(fs_record, t_start_ns);
  OFF(fs_record, send_count);
  OFF(fs_record, recv_count);
  OFF(fs_record, posted);
  OFF(fs_record, completed);
  OFF(fs_record, flags);
  OFF(fs_record, qp_num);
  OFF(fs_record, name);
  OFF(fs_ring_header, magic);
  OFF(fs_ring_header, version);
  OFF(fs_ring_header, header_size);
  OFF(fs_ring_header, record_size);
  OFF(fs_ring_header, collector);
  OFF(fs_ring_header, capacity);
  OFF(fs_ring_header, pid);
  OFF(fs_ring_header, rank);
  OFF(fs_ring_header, local_rank);
  OFF(fs_ring_header, world_size);
  OFF(fs_ring_header, created_ns);
  OFF(fs_ring_header, job);
  OFF(fs_ring_header, host);
  OFF(fs_ring_header, write_idx);
  OFF(fs_ring_header, read_idx);
  OFF(fs_ring_header, dropped);
  OFF(fs_ring_header, pool_dropped);
  OFF(fs_ring_header, control);
  OFF(fs_ring_header, closed);
  OFF(fs_ring_header, caps);
  OFF(fs_ring_header, heartbeat_ns);
  printf("\"sizeof.fs_record\": %zu, \"sizeof.fs_ring_header\": %zu, ", sizeof(struct fs_record),
         sizeof(struct fs_ring_header));
  printf("\"magic\": %" PRIu64 ", \"version\": %u, \"null_time\": %" PRId64
         ", \"null_count\": %" PRIu64 "}\n",
         (uint64_t)FS_RING_MAGIC, FS_RING_VERSION, (int64_t)FS_NULL_TIME, (uint64_t)FS_NULL_COUNT);
  return 0;
}

static struct fs_ring g_r;
static long g_n;
static _Atomic int g_producers_done;

/* what a producer writes into `bytes`: a stale or torn payload does not match its seq */
static uint64_t payload_check(long id, uint64_t seq) {
  return (seq + 1) * 0x9E3779B97F4A7C15ULL ^ (uint64_t)id;
}

/* The Python reader's protocol (ring.py RingReader.drain) in C: the commit words with plain
 * (relaxed) loads, an acquire fence, the payload copy, a release fence, read_idx. */
static size_t drain_fenced(struct fs_ring *ring, struct fs_record *out, size_t max) {
  struct fs_ring_header *h = ring->hdr;
  uint64_t r = atomic_load_explicit(&h->read_idx, memory_order_relaxed);
  uint64_t w = atomic_load_explicit(&h->write_idx, memory_order_relaxed);
  size_t n = 0;
  while (n < max && r + n < w &&
         atomic_load_explicit(&ring->rec[(r + n) & ring->mask].commit, memory_order_relaxed) ==
             r + n + 1)
    n++;
  fs_fence_acquire();
  for (size_t j = 0; j < n; j++) memcpy(&out[j], &ring->rec[(r + j) & ring->mask], sizeof(out[j]));
  fs_fence_release();
  if (n) atomic_store_explicit(&h->read_idx, r + n, memory_order_relaxed);
  return n;
}

static void *producer(void *arg) {
  long id = (long)arg;
  for (long i = 0; i < g_n; i++) {
    uint64_t idx;
    struct fs_record *d = fs_ring_reserve(&g_r, &idx);
    if (!d) continue; /* full: counted, never waits */
    d->kind = FS_KIND_COLL;
    d->rank = (int32_t)id;
    d->seq = (uint64_t)i;
    d->bytes = payload_check(id, (uint64_t)i);
    d->t_ns = fs_now_ns();
    fs_ring_commit(&g_r, d, idx);
  }
  atomic_fetch_add(&g_producers_done, 1);
  return NULL;
}

static int stress(const char *path, int threads, long n, long cap, int fenced) {
  if (fs_ring_create(&g_r, path, (uint64_t)cap, NULL) != 0) return 2;
  g_n = n;
  pthread_t t[64];
  if (threads > 64) threads = 64;
  for (long i = 0; i < threads; i++) pthread_create(&t[i], NULL, producer, (void *)i);
  struct fs_record buf[256];
  long last[64];
  for (int i = 0; i < 64; i++) last[i] = -1;
  long got = 0, disorder = 0, bad = 0;
  for (;;) {
    int done = atomic_load(&g_producers_done) == threads;
    size_t k = fenced ? drain_fenced(&g_r, buf, 256) : fs_ring_drain(&g_r, buf, 256);
    for (size_t j = 0; j < k; j++) {
      int id = buf[j].rank;
      if (id < 0 || id >= threads || buf[j].kind != FS_KIND_COLL ||
          buf[j].bytes != payload_check(id, buf[j].seq)) {
        bad++;
        continue;
      }
      if ((long)buf[j].seq <= last[id]) disorder++;
      last[id] = (long)buf[j].seq;
      got++;
    }
    if (done && k == 0) break;
  }
  for (int i = 0; i < threads; i++) pthread_join(t[i], NULL);
  got += (long)fs_ring_drain(&g_r, buf, 256);
  uint64_t dropped = atomic_load(&g_r.hdr->dropped);
  printf("{\"got\": %ld, \"dropped\": %" PRIu64 ", \"total\": %ld, \"disorder\": %ld, \"bad\": %ld}\n",
         got, dropped, threads * n, disorder, bad);
  fs_ring_detach(&g_r);
  return (got + (long)dropped == threads * n && disorder == 0 && bad == 0) ? 0 : 1;
}

static int full(const char *path, long n, long cap) {
  struct fs_ring r;
  if (fs_ring_create(&r, path, (uint64_t)cap, NULL) != 0) return 2;
  long written = 0;
  int64_t t0 = fs_now_ns();
  for (long i = 0; i < n; i++) {
    struct fs_record rec;
    memset(&rec, 0, sizeof(rec));
    rec.kind = FS_KIND_COLL;
    rec.seq = (uint64_t)i;
    if (fs_ring_put(&r, &rec) == 0) written++;
  }
  int64_t dt = fs_now_ns() - t0;
  printf("{\"written\": %ld, \"dropped\": %" PRIu64 ", \"capacity\": %" PRIu64
         ", \"ns\": %" PRId64 "}\n",
         written, atomic_load(&r.hdr->dropped), r.capacity, dt);
  fs_ring_detach(&r);
  return 0;
}

static struct fs_proc_ring g_proc = {.collector = FS_SRC_TEST, .tag = "test"};

static void put_marker(int32_t who, uint64_t i) {
  struct fs_ring *r = fs_proc_ring_get(&g_proc);
  if (!r) return;
  struct fs_record rec;
  memset(&rec, 0, sizeof(rec));
  rec.kind = FS_KIND_COLL;
  rec.rank = who;
  rec.seq = i;
  rec.t_ns = fs_now_ns();
  fs_ring_put(r, &rec);
}

static int forked(void) {
  put_marker(1, 0);
  put_marker(1, 1);
  pid_t child = fork();
  if (child == 0) {
    for (uint64_t i = 0; i < 3; i++) put_marker(2, i);
    struct fs_ring *r = fs_proc_ring_get(&g_proc);
    _exit(r && r->hdr->pid == (int32_t)getpid() ? 0 : 3);
  }
  int st = 0;
  waitpid(child, &st, 0);
  put_marker(1, 2);
  printf("{\"parent\": %d, \"child\": %d, \"child_status\": %d}\n", (int)getpid(), (int)child,
         WIFEXITED(st) ? WEXITSTATUS(st) : -1);
  fs_proc_ring_close(&g_proc);
  return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : 1;
}

static int fill(const char *path, long n, long cap) {
  struct fs_ring r;
  struct fs_ring_meta meta = {.job = "jobA", .rank = 3, .collector = FS_SRC_TEST};
  if (fs_ring_create(&r, path, (uint64_t)cap, &meta) != 0) return 2;
  for (long i = 0; i < n; i++) {
    struct fs_record rec;
    memset(&rec, 0, sizeof(rec));
    rec.kind = FS_KIND_COLL;
    rec.op = (uint8_t)(i % 8);
    rec.phase = (uint8_t)(i % 2);
    rec.source = FS_SRC_TEST;
    rec.rank = (i % 3 == 0) ? -1 : 3;
    rec.comm_rank = 1;
    rec.comm_size = 4;
    rec.peer = (rec.op >= FS_OP_SEND || rec.op == FS_OP_BROADCAST) ? 2 : -1;
    rec.comm = 0xF000000000000000ULL + (uint64_t)(i % 5);
    rec.seq = (uint64_t)(i / 2);
    rec.bytes = (uint64_t)i * 16;
    rec.t_ns = 1700000000000000000LL + i * 1000;
    rec.t_start_ns = rec.phase == FS_PHASE_END ? rec.t_ns - 500 : FS_NULL_TIME;
    rec.send_count = rec.phase == FS_PHASE_END ? (uint64_t)i : FS_NULL_COUNT;
    rec.recv_count = FS_NULL_COUNT;
    fs_ring_put(&r, &rec);
  }
  fs_ring_detach(&r);
  printf("{\"written\": %ld}\n", n);
  return 0;
}

int main(int argc, char **argv) {
  if (argc < 2) return 2;
  if (!strcmp(argv[1], "layout")) return layout();
  if (!strcmp(argv[1], "stress") && (argc == 6 || argc == 7))
    return stress(argv[2], atoi(argv[3]), atol(argv[4]), atol(argv[5]),
                  argc == 7 && !strcmp(argv[6], "fenced"));
  if (!strcmp(argv[1], "full") && argc == 5) return full(argv[2], atol(argv[3]), atol(argv[4]));
  if (!strcmp(argv[1], "fork")) return forked();
  if (!strcmp(argv[1], "fill") && argc == 5) return fill(argv[2], atol(argv[3]), atol(argv[4]));
  return 2;
}
