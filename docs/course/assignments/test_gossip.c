/* test_gossip.c - the harness of assignment 2 (gossip.md): student_gossip_step against the library's D-PSGD
   gossip, dt_dpsgd_step(d, NULL) (a pure gossip step: no optimizer), on 2 to 5 local ranks over rings, a torus,
   exponential and fully connected graphs, irregular graphs with Metropolis weights and the one-peer exponential
   schedule (a new graph every step, where a rank may have no peer). Every rank's replica is a linear layer's
   parameters, different on every rank; the library and the student each run STEPS steps from the same replica.
   A case passes when after every step every rank's replica has the library's bits and the rank sent and
   received the bytes the library's step did (dt_comm_get_stats). A case that differs names the step, the rank,
   the first element and both values, or the step, the rank and both byte counts.
   usage: test_gossip          (make assignment-test A=gossip builds and runs it) */
#include <math.h>
#include "assignments.h"
#include "harness.h"

#define MAXR  5
#define STEPS 3

typedef struct gossip_case {
    const dt_topology    *topo;              /* a fixed graph, or NULL: */
    dt_topology_schedule *sched;             /* the graph of step t is graphs[t mod period] */
    int                   in, out;           /* the replica: a linear layer in -> out with bias */
    int64_t               n;                 /* its parameters, in * out + out */
    float                *want[MAXR], *got[MAXR];     /* [STEPS * n] each: the replica after each step */
    dt_comm_stats         lib[MAXR][STEPS], mine[MAXR][STEPS];
    dt_result             ret[MAXR];         /* the first failure of student_gossip_step on each rank */
    int                   ret_step[MAXR];
    char                  msg[MAXR][256];
} gossip_case;

static dt_result rank_fn(dt_comm *c, void *arg) {
    gossip_case *k = (gossip_case *)arg;
    int me = dt_comm_rank(c), t;
    dt_model *m = NULL;
    dt_dpsgd *d = NULL;
    dt_model_desc md;
    dt_dpsgd_desc dd;
    dt_rng g;
    float *x, *mine = (float *)malloc(sizeof(float) * (size_t)k->n);
    int64_t n = 0, i;
    dt_result r;
    memset(&md, 0, sizeof md);
    memset(&dd, 0, sizeof dd);
    md.in_c = k->in;
    md.seed = 1;
    if (k->sched) {
        dd.schedule = dt_topology_schedule_at;
        dd.schedule_user = k->sched;
        dd.period = k->sched->period;
    }
    if (!mine) return dt_set_error(DT_ERR_OUT_OF_MEMORY, "test_gossip: rank %d: no memory", me);
    if ((r = dt_model_create(&m, &md)) != DT_OK) goto done;
    dt_linear(m, dt_model_input(m), k->out, 1);
    if ((r = dt_model_finalize(m)) != DT_OK) goto done;
    if ((r = dt_dpsgd_create(&d, c, m, k->sched ? NULL : k->topo, &dd)) != DT_OK) goto done;   /* broadcasts rank 0's */
    x = dt_model_params(m, &n);
    if (n != k->n) { r = dt_set_error(DT_ERR_STATE, "test_gossip: %lld parameters, not %lld", (long long)n, (long long)k->n); goto done; }
    dt_rng_init(&g, 36, (uint64_t)me);   /* then each rank's own replica */
    for (i = 0; i < n; i++) mine[i] = x[i] = h_value(&g);
    for (t = 0; t < STEPS; t++) {
        const dt_topology *gt = k->sched ? dt_topology_schedule_at(t, k->sched) : k->topo;
        dt_comm_reset_stats(c);
        if ((r = dt_dpsgd_step(d, NULL)) != DT_OK) goto done;
        k->lib[me][t] = dt_comm_get_stats(c);
        memcpy(k->want[me] + (int64_t)t * n, x, sizeof(float) * (size_t)n);
        dt_comm_reset_stats(c);
        r = student_gossip_step(c, gt, mine, n);
        k->mine[me][t] = dt_comm_get_stats(c);
        memcpy(k->got[me] + (int64_t)t * n, mine, sizeof(float) * (size_t)n);
        if (r != DT_OK) {
            k->ret[me] = r;
            k->ret_step[me] = t;
            snprintf(k->msg[me], sizeof k->msg[me], "%s", dt_last_error());
            goto done;
        }
    }
done:
    dt_dpsgd_destroy(d);
    dt_model_destroy(m);
    free(mine);
    return r;
}

/* Runs one case; returns 0 when the harness should not go on (a rank stalled, or a wait timed out). */
static int run_case(const char *name, int p, const dt_topology *topo, dt_topology_schedule *sched, int in, int out) {
    gossip_case k;
    dt_result r;
    int i, t, ok = 1;
    char what[96], vals[320];
    memset(&k, 0, sizeof k);
    k.topo = topo; k.sched = sched; k.in = in; k.out = out;
    k.n = (int64_t)in * out + out;
    snprintf(what, sizeof what, "%s p=%d n=%lld", name, p, (long long)k.n);
    for (i = 0; i < p; i++) {
        k.want[i] = (float *)malloc(sizeof(float) * (size_t)(STEPS * k.n));
        k.got[i] = (float *)malloc(sizeof(float) * (size_t)(STEPS * k.n));
        if (!k.want[i] || !k.got[i]) { h_report(0, "%s: the harness has no memory", what); return 0; }
    }
    if (!h_launch(p, rank_fn, &k, what, &r)) return 0;
    if ((i = h_first_failure(k.ret, p)) >= 0) {
        h_report(0, "%s: step %d, rank %d: student_gossip_step returned %s", what, k.ret_step[i], i,
                 h_why(vals, sizeof vals, k.ret[i], k.msg[i]));
        ok = 0;
    }
    if (ok && r != DT_OK) { h_report(0, "%s: the run failed: %s", what, dt_last_error()); ok = 0; }
    for (t = 0; t < STEPS && ok; t++)
        for (i = 0; i < p && ok; i++) {
            const float *w = k.want[i] + (int64_t)t * k.n, *g = k.got[i] + (int64_t)t * k.n;
            int64_t first, diff = h_diff(w, g, k.n, &first), j, rounding = 1;
            if (diff) {
                for (j = 0; j < k.n && rounding; j++)
                    rounding = fabs((double)g[j] - (double)w[j]) <= 1e-5 * fabs((double)w[j]) + 1e-30;
                h_values(vals, sizeof vals, w[first], g[first]);
                h_report(0, "%s: step %d, rank %d, element %lld: %s (%lld of %lld elements differ on this rank)%s", what, t, i,
                         (long long)first, vals, (long long)diff, (long long)k.n,
                         rounding ? "; every element is right to rounding: the sum is not in double, or not in the library's "
                                 "order (the sheet, \"The order of the sum\")" : "");
                ok = 0;
            } else if (k.mine[i][t].collectives > 1) {
                h_report(0, "%s: step %d, rank %d made %llu collective calls (dt_comm_get_stats: collectives); a step is one "
                         "neighbour exchange at most (the sheet, \"Rules\")", what, t, i, (unsigned long long)k.mine[i][t].collectives);
                ok = 0;
            } else if (k.mine[i][t].bytes_sent != k.lib[i][t].bytes_sent || k.mine[i][t].bytes_recv != k.lib[i][t].bytes_recv) {
                h_report(0, "%s: step %d, rank %d sent %llu and received %llu bytes; the library's step sent %llu and received "
                         "%llu (the sheet, \"The traffic\")", what, t, i, (unsigned long long)k.mine[i][t].bytes_sent,
                         (unsigned long long)k.mine[i][t].bytes_recv, (unsigned long long)k.lib[i][t].bytes_sent,
                         (unsigned long long)k.lib[i][t].bytes_recv);
                ok = 0;
            }
        }
    if (ok) {
        unsigned long long b = 0;
        for (i = 0; i < p; i++) for (t = 0; t < STEPS; t++) b += k.lib[i][t].bytes_sent;
        h_report(1, "%s: %d steps, every rank has the library's bits; %llu bytes sent in all, as the library's", what,
                 STEPS, b);
    }
    for (i = 0; i < p; i++) { free(k.want[i]); free(k.got[i]); }
    return h_go_on(k.ret, p, r);
}

/* A graph of kind on p ranks (adj: the custom graph's adjacency), run as one case, then freed. */
static int graph_case(const char *name, int p, dt_topology_kind kind, dt_mixing_kind mixing, const uint8_t *adj, int in, int out) {
    dt_topology topo;
    dt_topology_desc td;
    int go;
    memset(&td, 0, sizeof td);
    td.kind = kind; td.world = p; td.mixing = mixing; td.adjacency = adj;
    if (dt_topology_create(&topo, &td) != DT_OK) {
        h_report(0, "%s p=%d: the harness could not build the graph: %s", name, p, dt_last_error());
        return 1;
    }
    go = run_case(name, p, &topo, NULL, in, out);
    dt_topology_free(&topo);
    return go;
}

int main(void) {
    /* irregular graphs, whose Metropolis weights differ from edge to edge: a path 0-1-2-3-4 with the chord 1-3,
       and a star around rank 0 of 4 ranks */
    static const uint8_t path5[25] = {0, 1, 0, 0, 0,  1, 0, 1, 1, 0,  0, 1, 0, 1, 0,  0, 1, 1, 0, 1,  0, 0, 0, 1, 0};
    static const uint8_t star4[16] = {0, 1, 1, 1,  1, 0, 0, 0,  1, 0, 0, 0,  1, 0, 0, 0};
    int p, go = 1;
    for (p = 2; p <= MAXR && go; p++) go = graph_case("ring", p, DT_TOPO_RING, DT_MIXING_UNIFORM, NULL, 3, 2);
    if (go) go = graph_case("ring", 4, DT_TOPO_RING, DT_MIXING_UNIFORM, NULL, 100, 50);
    if (go) go = graph_case("torus", 4, DT_TOPO_TORUS, DT_MIXING_UNIFORM, NULL, 10, 10);
    if (go) go = graph_case("exponential", 5, DT_TOPO_EXPONENTIAL, DT_MIXING_UNIFORM, NULL, 10, 10);
    if (go) go = graph_case("full", 3, DT_TOPO_FULL, DT_MIXING_UNIFORM, NULL, 10, 10);
    if (go) go = graph_case("path with a chord (Metropolis)", 5, DT_TOPO_CUSTOM, DT_MIXING_METROPOLIS, path5, 10, 10);
    if (go) go = graph_case("star (Metropolis)", 4, DT_TOPO_CUSTOM, DT_MIXING_METROPOLIS, star4, 10, 10);
    for (p = 4; p <= 5 && go; p++) {   /* p = 5: a rank whose partner is not a rank sits a step out */
        dt_topology_schedule s;
        if (dt_topology_one_peer_exp(&s, p) != DT_OK) {
            h_report(0, "one-peer exponential p=%d: the harness could not build the schedule: %s", p, dt_last_error());
            continue;
        }
        go = run_case("one-peer exponential schedule", p, NULL, &s, 10, 10);
        dt_topology_schedule_free(&s);
    }
    return h_end("test_gossip") | !go;
}
