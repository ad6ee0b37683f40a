/*
 * Joining enter/end rows into rounds in one pass (detectors/slowdown/rounds.py,
 * RoundJoiner; CCL-D §5.1 Trace ID): the same rounds, in the same order, as its numpy form,
 * which stays the fallback; tests/unit/detectors/test_round_kernel.py holds them equal.
 *
 * Input: a matrix of FS_COLS int64 columns (rounds.py _POP order) over the pending member
 * operations followed by the batch's rows. Rows of one operation (cidx, rank, seq) merge
 * into one (times and the point-to-point call number: their maximum; the rest from its
 * first row). A collective round is complete when all comm_size members entered and ended;
 * a point-to-point round is the k-th send a->b with the k-th recv on b from a. Completed
 * rounds come out collectives first in (cidx, seq) order, members by rank, then
 * point-to-point rounds in (cidx, src, dst, k) order, send first; the operations left
 * pending go back out in the same column layout.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h> /* qsort */
#include <string.h> /* memset */

#define FS_NULL_TIME INT64_MIN
#define FS_COLS 13
enum { C_RANK, C_COMM, C_CIDX, C_CR, C_SIZE, C_SEQ, C_OP, C_NBYTES, C_PEER, C_TE, C_TX, C_TS,
       C_K };
#define OP_SEND 6
#define OP_RECV 7
/* rounds matrix rows */
enum { R_CIDX, R_COMM, R_SEQ, R_OP, R_NBYTES, R_MEMBERS, R_TFIRST, R_TLAST, R_TEND,
       R_LASTRANK, R_DMAX, R_DMIN, R_GROUP, R_COLS };

__attribute__((visibility("default"))) int64_t fs_rounds_version(void) { return 1; }

static uint64_t mix(uint64_t h, uint64_t v) {
    h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
    h *= 0xff51afd7ed558ccdULL;
    return h ^ (h >> 33);
}

/* the caller's workspace, handed out in 8-byte words (no allocation per call: fresh pages
 * cost more than the work on them) */
typedef struct {
    int64_t *base;
    size_t len, used, need;
} arena_t;

static void *take(arena_t *a, size_t words) {
    a->need += words;
    if (a->used + words > a->len) return NULL;
    void *p = a->base + a->used;
    a->used += words;
    return p;
}

/* open addressing over up to 4 int64 key parts; values are dense ids 0.. in creation order.
 * A slot is one word: the id + 1 (0: empty) and 32 bits of the key's hash; the keys
 * themselves lie in creation order beside it. The slots stay small enough for the cache
 * and a key is read only when its hash bits match (a lookup soon after the insert, as
 * the end of an operation follows its enter, finds it still cached). */
typedef struct {
    uint64_t *slots; /* cap */
    int64_t *keys;   /* ids * parts */
    size_t cap, parts;
    int64_t n;
} table_t;

static int table_init(table_t *t, arena_t *a, size_t want, size_t parts) {
    size_t cap = 16;
    while (cap < 2 * want) cap <<= 1;
    t->slots = take(a, cap);
    t->keys = take(a, (want + 1) * parts);
    if (!t->slots || !t->keys) return -1;
    memset(t->slots, 0, cap * sizeof(uint64_t));
    t->cap = cap;
    t->parts = parts;
    t->n = 0;
    return 0;
}

/* the id of key (a new one when absent: *fresh set) */
static int64_t table_get(table_t *t, const int64_t *key, int *fresh) {
    uint64_t h = 0;
    size_t parts = t->parts;
    for (size_t j = 0; j < parts; j++) h = mix(h, (uint64_t)key[j]);
    uint64_t tag = h >> 32;
    size_t mask = t->cap - 1, i = (size_t)h & mask;
    for (;;) {
        uint64_t slot = t->slots[i];
        if (slot == 0) {
            int64_t id = t->n++;
            memcpy(t->keys + (size_t)id * parts, key, parts * sizeof(int64_t));
            t->slots[i] = (tag << 32) | (uint64_t)(id + 1);
            *fresh = 1;
            return id;
        }
        if ((slot >> 32) == tag) {
            int64_t id = (int64_t)(slot & 0xffffffffULL) - 1;
            const int64_t *k = t->keys + (size_t)id * parts;
            size_t j = 0;
            while (j < parts && k[j] == key[j]) j++;
            if (j == parts) {
                *fresh = 0;
                return id;
            }
        }
        i = (i + 1) & mask;
    }
}

typedef struct {
    int64_t key[4];
    int64_t id;
} sortkey_t;

static int cmp_key(const void *a, const void *b) {
    const sortkey_t *x = a, *y = b;
    for (int j = 0; j < 4; j++) {
        if (x->key[j] != y->key[j]) return x->key[j] < y->key[j] ? -1 : 1;
    }
    return 0;
}

/* members of one round ordered by a sort column (rank, or op for point-to-point) */
static const int64_t *g_sortcol;
static int cmp_member(const void *a, const void *b) {
    int64_t x = g_sortcol[*(const int64_t *)a], y = g_sortcol[*(const int64_t *)b];
    return x < y ? -1 : x > y;
}

static void sort_members(int64_t *m, int64_t count, const int64_t *col) {
    if (count <= 24) {
        for (int64_t i = 1; i < count; i++) {
            int64_t v = m[i], j = i - 1;
            while (j >= 0 && col[m[j]] > col[v]) {
                m[j + 1] = m[j];
                j--;
            }
            m[j + 1] = v;
        }
        return;
    }
    g_sortcol = col;
    qsort(m, (size_t)count, sizeof(int64_t), cmp_member);
}

/* The workspace fs_rounds needs for n rows, in int64 words (an upper bound). */
__attribute__((visibility("default")))
int64_t fs_rounds_work(int64_t n) {
    size_t cap = 16;
    while (cap < 2 * (size_t)n) cap <<= 1;
    /* three tables: slots, and keys of 3, 2 and 4 words per id */
    return (int64_t)(cap * 3 + ((size_t)n + 1) * (3 + 2 + 4) +
                     ((size_t)n + 1) * (FS_COLS + 7 + 10 + 1 + 6) + 64);
}

/*
 * rows: FS_COLS x n (row-major by column: rows[c * n + i]). now, max_age: pending
 * operations whose latest time is older than now - max_age are dropped (0: never).
 * work: fs_rounds_work(n) words of scratch space, reused between calls.
 * Outputs, each with room for n: pend (FS_COLS x n; may be rows itself, read before),
 * rounds (R_COLS x n, written in columns n - r .. n - 1: it may be pend's buffer too, as
 * r + kept <= n), transfer (n),
 * m_round / m_rank / m_wait (n). counts[0..2]: pending, rounds, members; counts[3]: the
 * workspace words used. Returns 0, or -1 when the workspace was too small.
 */
__attribute__((visibility("default")))
int fs_rounds(int64_t n, const int64_t *rows, int64_t now, int64_t max_age,
              int64_t *work, int64_t work_len,
              int64_t *pend, int64_t *rounds, double *transfer,
              int64_t *m_round, int64_t *m_rank, int64_t *m_wait, int64_t *counts) {
    int rc = -1;
    arena_t arena = {work, (size_t)work_len, 0, 0}, *a = &arena;
    table_t ops_t = {0}, coll_t = {0}, p2p_t = {0};
    int64_t *ops, *op_round, *r_first, *r_count, *r_valid, *r_send, *r_minrank, *r_size,
            *r_off, *r_fill, *members, *out_of, *rank_of, *op_of;
    sortkey_t *done_c, *done_p;
    int64_t *done;
    int64_t nops = 0;
    size_t un = (size_t)n + 1;
    const int64_t *col[FS_COLS];
    for (int c = 0; c < FS_COLS; c++) col[c] = rows + (size_t)c * (size_t)n;

    /* 1. merge the rows of each operation */
    if (table_init(&ops_t, a, (size_t)n, 3) != 0) goto out;
    ops = take(a, un * FS_COLS);
    if (!ops) goto out;
    for (int64_t i = 0; i < n; i++) {
        int64_t key[3] = {col[C_CIDX][i], col[C_RANK][i], col[C_SEQ][i]};
        int fresh;
        int64_t o = table_get(&ops_t, key, &fresh);
        int64_t *dst = ops + o * FS_COLS;
        if (fresh) {
            for (int c = 0; c < FS_COLS; c++) dst[c] = col[c][i];
            nops++;
        } else {
            for (int c = C_TE; c <= C_K; c++)
                if (col[c][i] > dst[c]) dst[c] = col[c][i];
        }
    }

    /* 2. rounds: collectives by (cidx, seq), point-to-point by (cidx, src, dst, k) */
    if (table_init(&coll_t, a, (size_t)nops, 2) != 0 ||
        table_init(&p2p_t, a, (size_t)nops, 4) != 0)
        goto out;
    op_round = take(a, un);
    r_first = take(a, un); r_count = take(a, un); r_valid = take(a, un);
    r_send = take(a, un); r_minrank = take(a, un); r_size = take(a, un);
    if (!op_round || !r_first || !r_count || !r_valid || !r_send || !r_minrank || !r_size)
        goto out;
    /* round ids run up to nops - 1 (point-to-point ones count down from there) */
    memset(r_count, 0, (size_t)nops * sizeof(int64_t));
    memset(r_valid, 0, (size_t)nops * sizeof(int64_t));
    memset(r_send, 0, (size_t)nops * sizeof(int64_t));
    /* round ids: collectives 0.., point-to-point from nops down (kept apart) */
    int64_t ncoll_r = 0, np2p_r = 0;
    for (int64_t o = 0; o < nops; o++) {
        const int64_t *p = ops + o * FS_COLS;
        int is_p2p = p[C_OP] == OP_SEND || p[C_OP] == OP_RECV;
        int valid = p[C_TE] != FS_NULL_TIME && p[C_TX] != FS_NULL_TIME;
        int fresh;
        int64_t r;
        if (!is_p2p) {
            int64_t key[2] = {p[C_CIDX], p[C_SEQ]};
            r = table_get(&coll_t, key, &fresh);
            ncoll_r = coll_t.n;
        } else if (p[C_K] >= 0) {
            int send = p[C_OP] == OP_SEND;
            int64_t key[4] = {p[C_CIDX], send ? p[C_CR] : p[C_PEER],
                              send ? p[C_PEER] : p[C_CR], p[C_K]};
            r = nops - 1 - table_get(&p2p_t, key, &fresh);
            np2p_r = p2p_t.n;
            r_send[r] += send;
        } else {
            op_round[o] = -1;
            continue;
        }
        op_round[o] = r;
        if (fresh) {
            r_first[r] = o;
            r_minrank[r] = p[C_RANK];
            r_size[r] = p[C_SIZE];
        } else if (p[C_RANK] < r_minrank[r]) {
            r_minrank[r] = p[C_RANK];
            r_size[r] = p[C_SIZE];
        }
        r_count[r]++;
        r_valid[r] += valid;
    }

    /* 3. the complete rounds, in key order */
    done_c = take(a, (size_t)(ncoll_r + 1) * (sizeof(sortkey_t) / sizeof(int64_t)));
    done_p = take(a, (size_t)(np2p_r + 1) * (sizeof(sortkey_t) / sizeof(int64_t)));
    done = take(a, un);
    if (!done_c || !done_p || !done) goto out;
    memset(done, 0, (size_t)nops * sizeof(int64_t));
    int64_t nc = 0, np = 0;
    for (int64_t r = 0; r < ncoll_r; r++) {
        if (r_valid[r] == r_size[r] && r_count[r] == r_valid[r]) {
            const int64_t *p = ops + r_first[r] * FS_COLS;
            done_c[nc] = (sortkey_t){{p[C_CIDX], p[C_SEQ], 0, 0}, r};
            nc++;
        }
    }
    for (int64_t j = 0; j < np2p_r; j++) {
        int64_t r = nops - 1 - j;
        if (r_count[r] == 2 && r_valid[r] == 2 && r_send[r] == 1) {
            const int64_t *p = ops + r_first[r] * FS_COLS;
            int send = p[C_OP] == OP_SEND;
            done_p[np] = (sortkey_t){{p[C_CIDX], send ? p[C_CR] : p[C_PEER],
                                      send ? p[C_PEER] : p[C_CR], p[C_K]}, r};
            np++;
        }
    }
    qsort(done_c, (size_t)nc, sizeof(sortkey_t), cmp_key);
    qsort(done_p, (size_t)np, sizeof(sortkey_t), cmp_key);

    /* members of the complete rounds, grouped, in output order */
    r_off = take(a, un);
    r_fill = take(a, un);
    out_of = take(a, un); /* round -> output index */
    if (!r_off || !r_fill || !out_of) goto out;
    memset(r_fill, 0, (size_t)(nc + np) * sizeof(int64_t));
    int64_t total = 0;
    for (int64_t g = 0; g < nc + np; g++) {
        int64_t r = g < nc ? done_c[g].id : done_p[g - nc].id;
        out_of[r] = g;
        r_off[g] = total;
        total += r_count[r];
    }
    members = take(a, un);
    if (!members) goto out;
    for (int64_t o = 0; o < nops; o++) {
        int64_t r = op_round[o];
        if (r < 0) continue;
        int complete = r < ncoll_r ? (r_valid[r] == r_size[r] && r_count[r] == r_valid[r])
                                   : (r_count[r] == 2 && r_valid[r] == 2 && r_send[r] == 1);
        if (!complete) continue;
        done[o] = 1;
        int64_t g = out_of[r];
        members[r_off[g] + r_fill[g]++] = o;
    }

    /* 4. round statistics (rounds.py _rounds) */
    int64_t *rc_[R_COLS];
    /* the rounds go to the tail of their columns (n - rounds .. n - 1): the pending
     * operations, fewer than the rest, may then share the buffer from its head */
    size_t tail = (size_t)(n - (nc + np));
    for (int c = 0; c < R_COLS; c++) rc_[c] = rounds + (size_t)c * (size_t)n + tail;
    /* the sort columns of the members: rank (collectives), op (send first) */
    rank_of = take(a, un);
    op_of = take(a, un);
    if (!rank_of || !op_of) goto out;
    for (int64_t o = 0; o < nops; o++) {
        rank_of[o] = ops[o * FS_COLS + C_RANK];
        op_of[o] = ops[o * FS_COLS + C_OP];
    }
    int64_t mi = 0;
    for (int64_t g = 0; g < nc + np; g++) {
        int p2p = g >= nc;
        int64_t *m = members + r_off[g];
        int64_t count = r_fill[g];
        sort_members(m, count, p2p ? op_of : rank_of);
        int64_t dmax = INT64_MIN, dmin = INT64_MAX, tfirst = INT64_MAX, tlast = INT64_MIN,
                tend = INT64_MIN, nts = 0;
        double sum_ts = 0.0;
        for (int64_t j = 0; j < count; j++) {
            const int64_t *p = ops + m[j] * FS_COLS;
            int64_t te = p[C_TE], tx = p[C_TX], ts = p[C_TS], dur = tx - te;
            if (dur > dmax) dmax = dur;
            if (dur < dmin) dmin = dur;
            if (te < tfirst) tfirst = te;
            if (te > tlast) tlast = te;
            if (tx > tend) tend = tx;
            if (ts != FS_NULL_TIME && ts >= te && ts <= tx) {
                nts++;
                sum_ts += (double)(tx - ts);
            }
        }
        int64_t last_rank = 0;
        for (int64_t j = 0; j < count; j++) {
            const int64_t *p = ops + m[j] * FS_COLS;
            if (p[C_TX] - p[C_TE] == dmin) { last_rank = p[C_RANK]; break; }
        }
        const int64_t *f = ops + m[0] * FS_COLS;
        rc_[R_CIDX][g] = f[C_CIDX];
        rc_[R_COMM][g] = f[C_COMM];
        rc_[R_SEQ][g] = f[C_SEQ];
        rc_[R_OP][g] = p2p ? OP_SEND : f[C_OP];
        rc_[R_NBYTES][g] = f[C_NBYTES];
        rc_[R_MEMBERS][g] = count;
        rc_[R_TFIRST][g] = tfirst;
        rc_[R_TLAST][g] = tlast;
        rc_[R_TEND][g] = tend;
        rc_[R_LASTRANK][g] = last_rank;
        rc_[R_DMAX][g] = dmax;
        rc_[R_DMIN][g] = dmin;
        int64_t second = count > 1 ? m[1] : m[0];
        rc_[R_GROUP][g] = p2p ? (int64_t)(((uint64_t)f[C_RANK] << 32) |
                                          (uint64_t)ops[second * FS_COLS + C_RANK]) : -1;
        transfer[g] = nts > 0 ? rint(sum_ts / (double)nts) : (double)dmin;
        for (int64_t j = 0; j < count; j++) {
            const int64_t *p = ops + m[j] * FS_COLS;
            m_round[mi] = g;
            m_rank[mi] = p[C_RANK];
            m_wait[mi] = (p[C_TX] - p[C_TE]) - dmin;
            mi++;
        }
    }

    /* 5. what stays pending */
    int64_t kept = 0;
    for (int64_t o = 0; o < nops; o++) {
        if (done[o]) continue;
        const int64_t *p = ops + o * FS_COLS;
        if (max_age && now) {
            int64_t last = p[C_TE] > p[C_TX] ? p[C_TE] : p[C_TX];
            if (last < now - max_age) continue;
        }
        for (int c = 0; c < FS_COLS; c++) pend[(size_t)c * (size_t)n + (size_t)kept] = p[c];
        kept++;
    }
    counts[0] = kept;
    counts[1] = nc + np;
    counts[2] = mi;
    rc = 0;
out:
    counts[3] = (int64_t)a->need;
    return rc;
}
