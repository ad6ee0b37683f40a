/*
 * drv_nccl.c -- a "rank" calling the NCCL API (linked against the stub libnccl, optionally the
 * stub libcudart), run with LD_PRELOAD=libfailslow_nccl.so.
 *   drv_nccl basic IDSEED RANK     one op of every kind, a group, a split, an error, a capture
 *   drv_nccl phases N              N allreduces per phase; waits for a line on stdin between
 *                                  phases (the test flips the control word meanwhile)
 *   drv_nccl loop N                N allreduces
 *   drv_nccl threads T N           T threads, each with its own communicator, N ops each
 *   drv_nccl fork                  ops, fork: the child inits a comm and runs ops, parent again
 *   drv_nccl bench N               ns per ncclAllReduce call (printed as JSON)
 *   drv_nccl paced RATE SECONDS    ncclAllReduce at RATE calls/s for SECONDS (issued every
 *                                  millisecond, as a training rank would), for the agent's
 *                                  CPU benchmark
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "nccl_abi.h"

/* weak: present only when the driver is linked with the stub libcudart */
extern int cudaStreamSynchronize(cudaStream_t s) __attribute__((weak));

static cudaStream_t S = (cudaStream_t)0x5000;

static void sync_all(void) {
  if (cudaStreamSynchronize) cudaStreamSynchronize(S);
}

static ncclUniqueId make_id(unsigned seed) {
  ncclUniqueId id;
  for (int i = 0; i < NCCL_UNIQUE_ID_BYTES; i++) id.internal[i] = (char)((seed * 131u + (unsigned)i * 7u) & 0xff);
  return id;
}

#define CHECK(x)                                                   \
  do {                                                             \
    ncclResult_t r_ = (x);                                         \
    if (r_ != ncclSuccess) {                                       \
      fprintf(stderr, "%s:%d %s -> %d\n", __FILE__, __LINE__, #x, r_); \
      exit(3);                                                     \
    }                                                              \
  } while (0)

static int basic(unsigned seed, int rank) {
  ncclComm_t comm, sub;
  char buf[64];
  CHECK(ncclCommInitRank(&comm, 2, make_id(seed), rank));
  CHECK(ncclAllReduce(buf, buf, 1000, ncclFloat32, ncclSum, comm, S));       /* 4000 B */
  CHECK(ncclAllGather(buf, buf, 256, ncclBfloat16, comm, S));                /* 512 B */
  CHECK(ncclReduceScatter(buf, buf, 128, ncclFloat64, ncclSum, comm, S));    /* 1024 B */
  CHECK(ncclBroadcast(buf, buf, 10, ncclInt8, 1, comm, S));                  /* 10 B, root 1 */
  CHECK(ncclReduce(buf, buf, 7, ncclInt32, ncclMax, 0, comm, S));            /* 28 B, root 0 */
  CHECK(ncclAlltoAll(buf, buf, 4, ncclFloat32, comm, S));                    /* 4*4*2 = 32 B */
  CHECK(ncclGroupStart());
  CHECK(ncclSend(buf, 64, ncclFloat16, 1 - rank, comm, S));                  /* 128 B */
  CHECK(ncclRecv(buf, 64, ncclFloat16, 1 - rank, comm, S));
  CHECK(ncclGroupEnd());
  CHECK(ncclCommSplit(comm, 0, rank, &sub, NULL));
  CHECK(ncclAllReduce(buf, buf, 3, ncclUint8, ncclSum, sub, S));             /* 3 B on sub */
  if (ncclAllReduce(buf, buf, 0xBAD, ncclInt8, ncclSum, comm, S) == ncclSuccess) return 4;
  CHECK(ncclAllReduce(buf, buf, 5, ncclInt8, ncclSum, comm, (cudaStream_t)0xCA9)); /* captured */
  sync_all();
  CHECK(ncclCommDestroy(sub));
  CHECK(ncclCommDestroy(comm));
  return 0;
}

static int phases(int n) {
  ncclComm_t comm;
  char buf[8], line[64];
  CHECK(ncclCommInitRank(&comm, 1, make_id(7), 0));
  for (int p = 0; p < 3; p++) {
    for (int i = 0; i < n; i++) {
      CHECK(ncclGroupStart());
      CHECK(ncclAllReduce(buf, buf, 2, ncclFloat32, ncclSum, comm, S));
      CHECK(ncclGroupEnd());
    }
    sync_all();
    printf("phase %d\n", p);
    fflush(stdout);
    if (p < 2 && !fgets(line, sizeof(line), stdin)) return 5;
  }
  CHECK(ncclCommDestroy(comm));
  return 0;
}

static int loop(long n) {
  ncclComm_t comm;
  char buf[8];
  CHECK(ncclCommInitRank(&comm, 1, make_id(9), 0));
  for (long i = 0; i < n; i++) CHECK(ncclAllReduce(buf, buf, 2, ncclFloat32, ncclSum, comm, S));
  sync_all();
  CHECK(ncclCommDestroy(comm));
  return 0;
}

static long g_per_thread;

static void *thread_main(void *arg) {
  long id = (long)arg;
  ncclComm_t comm;
  char buf[8];
  CHECK(ncclCommInitRank(&comm, 1, make_id(100 + (unsigned)id), 0));
  for (long i = 0; i < g_per_thread; i++) {
    if (i % 4 == 3) {
      CHECK(ncclGroupStart());
      CHECK(ncclSend(buf, 1, ncclInt8, 0, comm, S));
      CHECK(ncclRecv(buf, 1, ncclInt8, 0, comm, S));
      CHECK(ncclGroupEnd());
    } else {
      CHECK(ncclAllReduce(buf, buf, 1, ncclInt8, ncclSum, comm, S));
    }
  }
  sync_all();
  CHECK(ncclCommDestroy(comm));
  return NULL;
}

static int threads(int t, long n) {
  pthread_t th[32];
  g_per_thread = n;
  if (t > 32) t = 32;
  for (long i = 0; i < t; i++) pthread_create(&th[i], NULL, thread_main, (void *)i);
  for (int i = 0; i < t; i++) pthread_join(th[i], NULL);
  return 0;
}

static int forked(void) {
  ncclComm_t comm;
  char buf[8];
  CHECK(ncclCommInitRank(&comm, 1, make_id(11), 0));
  CHECK(ncclAllReduce(buf, buf, 1, ncclInt8, ncclSum, comm, S));
  sync_all();
  fflush(stdout);
  pid_t child = fork();
  if (child == 0) {
    ncclComm_t c2;
    CHECK(ncclCommInitRank(&c2, 1, make_id(12), 0));
    for (int i = 0; i < 3; i++) CHECK(ncclAllGather(buf, buf, 1, ncclInt8, c2, S));
    _exit(0);
  }
  int st = 0;
  waitpid(child, &st, 0);
  CHECK(ncclAllReduce(buf, buf, 1, ncclInt8, ncclSum, comm, S));
  sync_all();
  printf("{\"parent\": %d, \"child\": %d}\n", (int)getpid(), (int)child);
  CHECK(ncclCommDestroy(comm));
  return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : 1;
}

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int bench(long n) {
  ncclComm_t comm;
  char buf[8];
  CHECK(ncclCommInitRank(&comm, 1, make_id(13), 0));
  for (long i = 0; i < 1000; i++) ncclAllReduce(buf, buf, 2, ncclFloat32, ncclSum, comm, S);
  int64_t t0 = now_ns();
  for (long i = 0; i < n; i++) ncclAllReduce(buf, buf, 2, ncclFloat32, ncclSum, comm, S);
  int64_t dt = now_ns() - t0;
  sync_all();
  printf("{\"calls\": %ld, \"ns_per_call\": %.3f}\n", n, (double)dt / (double)n);
  CHECK(ncclCommDestroy(comm));
  return 0;
}

static int paced(long rate, double seconds) {
  ncclComm_t comm;
  char buf[8];
  CHECK(ncclCommInitRank(&comm, 1, make_id(14), 0));
  int64_t t0 = now_ns(), end = t0 + (int64_t)(seconds * 1e9);
  long done = 0;
  struct timespec tick = {0, 1000000};
  for (;;) {
    int64_t t = now_ns();
    if (t >= end) break;
    long due = (long)((double)(t - t0) * (double)rate / 1e9);
    for (; done < due; done++) ncclAllReduce(buf, buf, 2, ncclFloat32, ncclSum, comm, S);
    nanosleep(&tick, NULL);
  }
  sync_all();
  printf("{\"calls\": %ld, \"seconds\": %.3f}\n", done, (double)(now_ns() - t0) / 1e9);
  CHECK(ncclCommDestroy(comm));
  return 0;
}

int main(int argc, char **argv) {
  if (argc < 2) return 2;
  if (!strcmp(argv[1], "paced") && argc == 4) return paced(atol(argv[2]), atof(argv[3]));
  if (!strcmp(argv[1], "basic") && argc == 4) return basic((unsigned)atoi(argv[2]), atoi(argv[3]));
  if (!strcmp(argv[1], "phases") && argc == 3) return phases(atoi(argv[2]));
  if (!strcmp(argv[1], "loop") && argc == 3) return loop(atol(argv[2]));
  if (!strcmp(argv[1], "threads") && argc == 4) return threads(atoi(argv[2]), atol(argv[3]));
  if (!strcmp(argv[1], "fork")) return forked();
  if (!strcmp(argv[1], "bench") && argc == 3) return bench(atol(argv[2]));
  return 2;
}
