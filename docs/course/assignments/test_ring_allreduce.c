/* test_ring_allreduce.c - the harness of assignment 1 (ring_allreduce.md): student_ring_allreduce against the
   library's ring, dt_comm_allreduce(c, buf, n, DT_F32, DT_SUM, DT_ALGO_RING), on 1 to 5 local ranks and sizes
   that divide among the ranks, that do not, that are smaller than the world, and that are larger than one of the
   library's pipeline segments. Each case passes when every rank ends with the library's bits in every element
   and sent and received the bytes the library's ring did, with no collective call (dt_comm_get_stats). A case
   that differs names the rank, the first element and both values, or the rank and both byte counts.
   usage: test_ring_allreduce          (make assignment-test A=ring_allreduce builds and runs it) */
#include <math.h>
#include "assignments.h"
#include "harness.h"

#define MAXR 5

typedef struct ring_case {
    int64_t       n;
    float        *want[MAXR], *got[MAXR];   /* [n] each: the library's result, the student's */
    dt_comm_stats lib[MAXR], mine[MAXR];    /* each rank's counters in the library's call, in the student's */
    dt_result     ret[MAXR];                /* student_ring_allreduce's result on each rank */
    char          msg[MAXR][256];           /* and its message */
} ring_case;

/* Rank r's vector: its own stream of the seed, so a case's data do not depend on the others. */
static void fill(float *x, int64_t n, int r) {
    dt_rng g;
    int64_t k;
    dt_rng_init(&g, 36, (uint64_t)r);
    for (k = 0; k < n; k++) x[k] = h_value(&g);
}

static dt_result rank_fn(dt_comm *c, void *arg) {
    ring_case *k = (ring_case *)arg;
    int me = dt_comm_rank(c);
    dt_result r;
    fill(k->want[me], k->n, me);
    memcpy(k->got[me], k->want[me], sizeof(float) * (size_t)k->n);
    dt_comm_reset_stats(c);
    if ((r = dt_comm_allreduce(c, k->want[me], (size_t)k->n, DT_F32, DT_SUM, DT_ALGO_RING)) != DT_OK) return r;
    k->lib[me] = dt_comm_get_stats(c);
    dt_comm_reset_stats(c);
    k->ret[me] = student_ring_allreduce(c, k->got[me], k->n);
    k->mine[me] = dt_comm_get_stats(c);
    if (k->ret[me] != DT_OK) snprintf(k->msg[me], sizeof k->msg[me], "%s", dt_last_error());
    return k->ret[me];
}

/* Runs one case; returns 0 when the harness should not go on (a rank stalled, or a wait timed out). */
static int run_case(int p, int64_t n) {
    ring_case k;
    dt_result r;
    int i, ok = 1;
    char what[64], vals[320];
    memset(&k, 0, sizeof k);
    k.n = n;
    snprintf(what, sizeof what, "p=%d n=%lld", p, (long long)n);
    for (i = 0; i < p; i++) {
        k.want[i] = (float *)malloc(sizeof(float) * (size_t)(n + 1));
        k.got[i] = (float *)malloc(sizeof(float) * (size_t)(n + 1));
        if (!k.want[i] || !k.got[i]) { h_report(0, "%s: the harness has no memory", what); return 0; }
    }
    if (!h_launch(p, rank_fn, &k, what, &r)) return 0;
    if ((i = h_first_failure(k.ret, p)) >= 0) {
        h_report(0, "%s: rank %d: student_ring_allreduce returned %s", what, i, h_why(vals, sizeof vals, k.ret[i], k.msg[i]));
        ok = 0;
    }
    if (ok && r != DT_OK) { h_report(0, "%s: the run failed: %s", what, dt_last_error()); ok = 0; }
    for (i = 0; i < p && ok; i++) {   /* the bits, rank by rank */
        int64_t first, diff = h_diff(k.want[i], k.got[i], n, &first);
        if (diff) {
            int64_t j, rounding = 1;
            for (j = 0; j < n && rounding; j++)   /* right to float rounding, everywhere? then the order differs */
                rounding = fabs((double)k.got[i][j] - (double)k.want[i][j]) <= 1e-5 * fabs((double)k.want[i][j]) + 1e-30;
            h_values(vals, sizeof vals, k.want[i][first], k.got[i][first]);
            h_report(0, "%s: rank %d, element %lld: %s (%lld of %lld elements differ on this rank)%s", what, i, (long long)first,
                     vals, (long long)diff, (long long)n,
                     rounding ? "; every element is right to rounding: the additions are not in the ring's order (the sheet, "
                             "\"The order of the additions\")" : "");
            ok = 0;
        }
    }
    for (i = 0; i < p && ok; i++)   /* point-to-point only: a collective (the library's all-reduce, say) is counted */
        if (k.mine[i].collectives) {
            h_report(0, "%s: rank %d made %llu collective call(s) (dt_comm_get_stats: collectives); the assignment allows "
                     "point-to-point calls only (the sheet, \"Rules\")", what, i, (unsigned long long)k.mine[i].collectives);
            ok = 0;
        }
    for (i = 0; i < p && ok; i++)   /* the traffic, rank by rank */
        if (k.mine[i].bytes_sent != k.lib[i].bytes_sent || k.mine[i].bytes_recv != k.lib[i].bytes_recv) {
            h_report(0, "%s: rank %d sent %llu and received %llu bytes; the library's ring sent %llu and received %llu "
                     "(the sheet, \"The traffic\")", what, i, (unsigned long long)k.mine[i].bytes_sent,
                     (unsigned long long)k.mine[i].bytes_recv, (unsigned long long)k.lib[i].bytes_sent,
                     (unsigned long long)k.lib[i].bytes_recv);
            ok = 0;
        }
    if (ok) {
        char bytes[96] = "";
        size_t at = 0;
        for (i = 0; i < p && at < sizeof bytes; i++)
            at += (size_t)snprintf(bytes + at, sizeof bytes - at, "%s%llu", i ? " " : "", (unsigned long long)k.lib[i].bytes_sent);
        h_report(1, "%s: every rank has the ring's bits; bytes sent per rank %s, as the library's", what, bytes);
    }
    for (i = 0; i < p; i++) { free(k.want[i]); free(k.got[i]); }
    return h_go_on(k.ret, p, r);
}

int main(void) {
    /* sizes: smaller than the world, not divisible, divisible, and chunks longer than a 256 KiB segment */
    static const int64_t sizes[] = {1, 3, 7, 12, 1001, 300007};
    int p;
    size_t s;
    for (p = 1; p <= MAXR; p++)
        for (s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
            if (!run_case(p, sizes[s])) return h_end("test_ring_allreduce") | 1;
    return h_end("test_ring_allreduce");
}
