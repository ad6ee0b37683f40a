/*
 * The slow-down detector's per-rank compute gaps in one pass (detectors/slowdown/gaps.py,
 * GapTracker; MEGATRACE §III-B/C): the same results as its numpy form, which stays the
 * fallback, and a parity test holds them equal (tests/unit/detectors/test_gap_kernel.py).
 *
 * Rows come sorted by (rank, time, ends before enters). Per rank the state is:
 *   last_end[r]       the latest end before the batch (INT64_MIN: none);
 *   ctx[r][0..5]      kind of the latest point-to-point call (0 none, 1 recv from the
 *                     previous stage, 2 from the next, 3 send to the next, 4 to the
 *                     previous), calls since it, the latest closed segment after a receive
 *                     of each direction, and whether the rank has neighbours before / after;
 *   tp_ctx[r][0..1]   tensor-parallel calls since the last other collective, and the
 *                     length of the latest such run.
 * The schedule context advances on enter rows only, as in the numpy form.
 *
 * Built as a plain shared library (setup.py, optional) and called through ctypes; C11,
 * no allocation, no global state.
 */
#include <stddef.h>
#include <stdint.h>

#define FS_NULL_TIME INT64_MIN
#define PASS_FWD 1
#define PASS_BWD 2

__attribute__((visibility("default"))) int64_t fs_gaps_version(void) { return 1; }

/* The pass of the gap before an enter from the pipeline context (GapTracker._passes),
 * then the context advanced past the row. */
static int64_t schedule_pass(int64_t *c, int64_t kind) {
    int64_t ctx_kind = c[0], since = c[1];
    if (kind == 1 || kind == 4) c[4] = 1;
    if (kind == 2 || kind == 3) c[5] = 1;
    int64_t first_stage = !c[4], last_stage = !c[5];
    int64_t seg1 = c[2], seg2 = c[3];
    int64_t out = 0;
    if (ctx_kind == 1) {
        out = PASS_FWD;
        if (last_stage && seg1 >= 2) out = 2 * since < seg1 ? PASS_FWD : PASS_BWD;
    } else if (ctx_kind == 2) {
        out = PASS_BWD;
        if (first_stage && seg2 >= 2) out = 2 * since < seg2 ? PASS_BWD : PASS_FWD;
    } else if (ctx_kind == 3) {
        out = PASS_FWD;
    } else if (ctx_kind == 4) {
        out = PASS_BWD;
    }
    if (kind > 0) {
        /* a point-to-point call closes the segment of the context before it */
        if (ctx_kind == 1 && since > 0) c[2] = since;
        if (ctx_kind == 2 && since > 0) c[3] = since;
        c[0] = kind;
        c[1] = 0;
    } else {
        c[1] = since + 1;
    }
    return out;
}

/* The pass from the tensor-parallel runs of a job without a pipeline
 * (GapTracker._tp_passes), then the run context advanced past the row. */
static int64_t tp_pass(int64_t *c, int is_tp, int64_t m) {
    int64_t run = c[0], seg = c[1];
    int closing = !is_tp && run > 0;
    int64_t out = 0;
    if (m > 0) {
        int64_t per = seg / m;
        int ok = seg > 0 && seg % m == 0 && per >= 2 && per % 2 == 0;
        if (ok && is_tp) out = 2 * (run % per) < per ? PASS_FWD : PASS_BWD;
        if (ok && closing) out = PASS_BWD;
    }
    c[0] = is_tp ? run + 1 : 0;
    if (closing) c[1] = run;
    return out;
}

/*
 * n rows sorted by (rank, t, ends first); rank[i] < the state arrays' length.
 * tp: NULL, or per row whether it is a tensor-parallel collective (jobs without a
 * pipeline). Writes, for each enter with a known end before it, its row position, gap and
 * pass; returns how many.
 */
__attribute__((visibility("default")))
int64_t fs_gaps(int64_t n, const int64_t *rank, const int64_t *t, const uint8_t *is_enter,
                const int64_t *kind, const uint8_t *tp, int64_t microbatches,
                int64_t *last_end, int64_t *ctx, int64_t *tp_ctx,
                int64_t *out_pos, int64_t *out_gap, int64_t *out_pass) {
    int64_t m = 0;
    int64_t cur = -1, batch_end = FS_NULL_TIME;
    int have_end = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t r = rank[i];
        if (r != cur) {
            if (cur >= 0 && have_end && batch_end > last_end[cur]) last_end[cur] = batch_end;
            cur = r;
            have_end = 0;
            batch_end = FS_NULL_TIME;
        }
        if (!is_enter[i]) {
            have_end = 1;
            batch_end = t[i];
            continue;
        }
        int64_t prev = have_end ? batch_end : last_end[r];
        int64_t pass = schedule_pass(ctx + 6 * r, kind[i]);
        if (tp != NULL) {
            int64_t by_tp = tp_pass(tp_ctx + 2 * r, tp[i] != 0, microbatches);
            if (pass == 0) pass = by_tp;
        }
        if (prev == FS_NULL_TIME) continue;
        int64_t gap = t[i] - prev;
        out_pos[m] = i;
        out_gap[m] = gap > 0 ? gap : 0;
        out_pass[m] = pass;
        m++;
    }
    if (cur >= 0 && have_end && batch_end > last_end[cur]) last_end[cur] = batch_end;
    return m;
}
