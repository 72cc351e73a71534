/* Gossip topologies: neighbours, mixing weights (uniform 1/(deg+1), Metropolis-Hastings), the checks
   (symmetric, doubly stochastic, connected) and the spectral gap against closed forms; the one-peer
   exponential schedule (its product over a period is exactly the averaging matrix for a power of two),
   dt_topology_check's refusals and the union's connectivity. */
#include "../dtrain.h"
#include "dt_test.h"

static int degree(const dt_topology *t, int i) { return t->offsets[i + 1] - t->offsets[i]; }

/* every row and column sums to 1, W is symmetric with nonnegative entries, zero off the graph */
static void check_mixing(const dt_topology *t) {
    int n = t->world, i, j, k;
    for (i = 0; i < n; i++) {
        double row = 0.0, col = 0.0;
        for (j = 0; j < n; j++) {
            int edge = 0;
            row += t->weights[i * n + j]; col += t->weights[j * n + i];
            CHECK(t->weights[i * n + j] == t->weights[j * n + i] && t->weights[i * n + j] >= 0.0);
            for (k = t->offsets[i]; k < t->offsets[i + 1]; k++) edge |= t->neighbors[k] == j;
            if (!edge && j != i) CHECK(t->weights[i * n + j] == 0.0);
        }
        CHECK(fabs(row - 1.0) < 1e-12 && fabs(col - 1.0) < 1e-12);
    }
}

static void test_ring(void) {
    int n;
    for (n = 1; n <= 16; n++) {
        dt_topology t;
        dt_topology_desc d;
        double pi = 3.14159265358979323846, want;
        memset(&d, 0, sizeof d);
        d.kind = DT_TOPO_RING; d.world = n;
        CHECK_OK(dt_topology_create(&t, &d));
        if (!t.world) continue;
        check_mixing(&t);
        if (n >= 3) {
            int i;
            for (i = 0; i < n; i++) {
                CHECK(degree(&t, i) == 2);
                CHECK(fabs(t.weights[i * n + (i + 1) % n] - 1.0 / 3.0) < 1e-15 && fabs(t.weights[i * n + i] - 1.0 / 3.0) < 1e-15);
            }
            /* eigenvalues 1/3 + 2/3 cos(2 pi k / n): lambda2 = max(|that at k=1|, |smallest|) */
            want = fabs(1.0 / 3.0 + 2.0 / 3.0 * cos(2 * pi / n));
            if (fabs(1.0 / 3.0 + 2.0 / 3.0 * cos(2 * pi * (n / 2) / n)) > want) want = fabs(1.0 / 3.0 + 2.0 / 3.0 * cos(2 * pi * (n / 2) / n));
            CHECK(fabs(t.lambda2 - want) < 1e-9 && fabs(t.spectral_gap - (1.0 - want)) < 1e-9);
        }
        if (n == 2) CHECK(degree(&t, 0) == 1 && fabs(t.weights[1] - 0.5) < 1e-15 && fabs(t.spectral_gap - 1.0) < 1e-9);
        if (n == 1) CHECK(degree(&t, 0) == 0 && t.weights[0] == 1.0);
        dt_topology_free(&t);
    }
}

static void test_torus_exponential_full(void) {
    dt_topology t;
    dt_topology_desc d;
    int i;
    memset(&d, 0, sizeof d);
    d.kind = DT_TOPO_TORUS; d.world = 16;                 /* 4 x 4: 4 neighbours, weights 1/5 */
    CHECK_OK(dt_topology_create(&t, &d));
    check_mixing(&t);
    for (i = 0; i < 16; i++) CHECK(degree(&t, i) == 4);
    CHECK(t.neighbors[t.offsets[5]] == 1 && t.neighbors[t.offsets[5] + 3] == 9);   /* 5: 1, 4, 6, 9 */
    /* eigenvalues (1 + 2cos(2pi a/4) + 2cos(2pi b/4)) / 5: lambda2 = |(1 + 2 - 2... )| = 3/5 */
    CHECK(fabs(t.lambda2 - 0.6) < 1e-9);
    dt_topology_free(&t);
    d.world = 12; d.rows = 0;                             /* most square: 3 x 4 */
    CHECK_OK(dt_topology_create(&t, &d));
    check_mixing(&t);
    dt_topology_free(&t);
    d.rows = 5;
    CHECK_ERR(dt_topology_create(&t, &d), DT_ERR_INVALID_ARG);
    memset(&d, 0, sizeof d);
    d.kind = DT_TOPO_EXPONENTIAL; d.world = 8;            /* +-1, +-2, +-4 (4 is its own mirror): degree 5 */
    CHECK_OK(dt_topology_create(&t, &d));
    check_mixing(&t);
    for (i = 0; i < 8; i++) CHECK(degree(&t, i) == 5);
    CHECK(t.spectral_gap > 0.3);
    dt_topology_free(&t);
    d.kind = DT_TOPO_FULL; d.world = 7;                   /* W = J / 7: one step reaches consensus */
    CHECK_OK(dt_topology_create(&t, &d));
    check_mixing(&t);
    CHECK(fabs(t.weights[3] - 1.0 / 7.0) < 1e-15 && fabs(t.spectral_gap - 1.0) < 1e-9);
    dt_topology_free(&t);
    {   /* the gap orders the graphs as theory says: full > exponential > ring for the same world */
        double gaps[3];
        dt_topology_kind kinds[3] = {DT_TOPO_FULL, DT_TOPO_EXPONENTIAL, DT_TOPO_RING};
        for (i = 0; i < 3; i++) {
            d.kind = kinds[i]; d.world = 32;
            CHECK_OK(dt_topology_create(&t, &d));
            gaps[i] = t.spectral_gap;
            dt_topology_free(&t);
        }
        CHECK(gaps[0] > gaps[1] && gaps[1] > gaps[2] && gaps[2] > 0.0);
    }
    CHECK(strcmp(dt_topology_name(DT_TOPO_TORUS), "torus") == 0);
}

/* A path 0-1-2-3 is not regular: uniform weights are refused, Metropolis-Hastings works. */
static void test_custom(void) {
    uint8_t path[16] = {0, 1, 0, 0, 1, 0, 1, 0, 0, 1, 0, 1, 0, 0, 1, 0};
    uint8_t split[16] = {0, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 1, 0, 0, 1, 0};
    uint8_t oneway[16] = {0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 1, 0, 0, 0};
    dt_topology t;
    dt_topology_desc d;
    memset(&d, 0, sizeof d);
    d.kind = DT_TOPO_CUSTOM; d.world = 4; d.adjacency = path;
    CHECK_ERR(dt_topology_create(&t, &d), DT_ERR_INVALID_ARG);
    CHECK(strstr(dt_last_error(), "METROPOLIS") != NULL && t.weights == NULL);
    d.mixing = DT_MIXING_METROPOLIS;
    CHECK_OK(dt_topology_create(&t, &d));
    check_mixing(&t);
    CHECK(fabs(t.weights[0 * 4 + 1] - 1.0 / 3.0) < 1e-15 && fabs(t.weights[0] - 2.0 / 3.0) < 1e-15);
    CHECK(fabs(t.weights[1 * 4 + 2] - 1.0 / 3.0) < 1e-15 && fabs(t.weights[1 * 4 + 1] - 1.0 / 3.0) < 1e-15);
    CHECK(t.spectral_gap > 0.0 && t.spectral_gap < 1.0);
    dt_topology_free(&t);
    d.adjacency = split;                                   /* {0,1} and {2,3}: not connected */
    CHECK_ERR(dt_topology_create(&t, &d), DT_ERR_INVALID_ARG);
    CHECK(strstr(dt_last_error(), "not connected") != NULL);
    d.adjacency = oneway;                                  /* a directed cycle */
    CHECK_ERR(dt_topology_create(&t, &d), DT_ERR_INVALID_ARG);
    CHECK(strstr(dt_last_error(), "not symmetric") != NULL);
    d.adjacency = NULL;
    CHECK_ERR(dt_topology_create(&t, &d), DT_ERR_INVALID_ARG);
    d.adjacency = path; d.world = 0;
    CHECK_ERR(dt_topology_create(&t, &d), DT_ERR_INVALID_ARG);
    d.world = 4; d.kind = (dt_topology_kind)9;
    CHECK_ERR(dt_topology_create(&t, &d), DT_ERR_INVALID_ARG);
    CHECK_ERR(dt_topology_create(&t, NULL), DT_ERR_INVALID_ARG);
    dt_topology_free(NULL);
}

/* Repeated mixing drives any start to the average at the rate the gap predicts. */
static void test_mixing_converges(void) {
    dt_topology t;
    dt_topology_desc d;
    double x[12], y[12], mean = 0.0, dev0 = 0.0, dev = 0.0;
    int i, j, step;
    memset(&d, 0, sizeof d);
    d.kind = DT_TOPO_RING; d.world = 12;
    CHECK_OK(dt_topology_create(&t, &d));
    for (i = 0; i < 12; i++) { x[i] = (double)(i * i % 7); mean += x[i] / 12.0; }
    for (i = 0; i < 12; i++) dev0 += (x[i] - mean) * (x[i] - mean);
    for (step = 0; step < 50; step++) {
        for (i = 0; i < 12; i++) {
            y[i] = 0.0;
            for (j = 0; j < 12; j++) y[i] += t.weights[i * 12 + j] * x[j];
        }
        memcpy(x, y, sizeof x);
    }
    for (i = 0; i < 12; i++) dev += (x[i] - mean) * (x[i] - mean);
    CHECK(sqrt(dev) <= pow(t.lambda2, 50) * sqrt(dev0) * (1 + 1e-9));   /* contraction by lambda2 per step */
    CHECK(sqrt(dev) < 0.1 * sqrt(dev0));
    dt_topology_free(&t);
}

/* c = a b, n x n */
static void matmul(const double *a, const double *b, double *c, int n) {
    int i, j, k;
    for (i = 0; i < n; i++)
        for (j = 0; j < n; j++) {
            double s = 0.0;
            for (k = 0; k < n; k++) s += a[i * n + k] * b[k * n + j];
            c[i * n + j] = s;
        }
}

/* The product of a period's W_t, from any step of it: exactly 1/p everywhere (in doubles) for p a power of
   two, and not for other p, whose repeated periods still converge to it. Each W_t pairs i with i xor 2^t, weights 1/2. */
static void test_one_peer_exp(void) {
    int p;
    for (p = 1; p <= 16; p++) {
        dt_topology_schedule s;
        const dt_topology *g[8];
        double prod[256], tmp[256], far = 0.0;
        int i, k, pow2 = (p & (p - 1)) == 0, period = 1, exact = 1, rep;
        while ((1 << period) < p) period++;
        CHECK_OK(dt_topology_one_peer_exp(&s, p));
        if (!s.graphs) continue;
        CHECK(s.world == p && s.period == period);
        for (i = 0; i < p * p; i++) prod[i] = i % (p + 1) == 0;   /* identity */
        for (k = 0; k < s.period; k++) {
            const dt_topology *t = &s.graphs[k];
            g[k] = t;
            CHECK(dt_topology_schedule_at(k, &s) == t && dt_topology_schedule_at(k + 5 * period, &s) == t);
            CHECK_OK(dt_topology_check(t, p, NULL));
            check_mixing(t);
            for (i = 0; i < p; i++) {
                int peer = i ^ (1 << k), has = peer < p;
                CHECK(degree(t, i) == has && (!has || t->neighbors[t->offsets[i]] == peer));
                CHECK(t->weights[i * p + i] == (has ? 0.5 : 1.0) && (!has || t->weights[i * p + peer] == 0.5));
            }
            matmul(prod, t->weights, tmp, p);
            memcpy(prod, tmp, sizeof(double) * (size_t)(p * p));
        }
        CHECK_OK(dt_topology_check_union(g, s.period, p, NULL));
        if (p > 2) {   /* one graph alone does not connect the ranks */
            CHECK_ERR(dt_topology_check_union(g, 1, p, "one graph"), DT_ERR_INVALID_ARG);
            CHECK(strstr(dt_last_error(), "one graph: the union of the 1 graphs is not connected") != NULL);
        }
        for (i = 0; i < p * p; i++) exact &= prod[i] == 1.0 / p;
        CHECK(exact == pow2);
        for (rep = 1; rep < s.period && pow2; rep++) {   /* any log2 p consecutive steps: the pairings commute */
            for (i = 0; i < p * p; i++) prod[i] = i % (p + 1) == 0;
            for (k = 0; k < s.period; k++) {
                matmul(prod, s.graphs[(rep + k) % s.period].weights, tmp, p);
                memcpy(prod, tmp, sizeof(double) * (size_t)(p * p));
            }
            for (i = 0; i < p * p; i++) CHECK(prod[i] == 1.0 / p);
        }
        for (rep = 0; rep < 60; rep++) {   /* 60 more periods */
            for (k = 0; k < s.period; k++) {
                matmul(prod, s.graphs[k].weights, tmp, p);
                memcpy(prod, tmp, sizeof(double) * (size_t)(p * p));
            }
        }
        for (i = 0; i < p * p; i++) far = fabs(prod[i] - 1.0 / p) > far ? fabs(prod[i] - 1.0 / p) : far;
        CHECK(far < 1e-9);
        dt_topology_schedule_free(&s);
        CHECK(s.graphs == NULL && s.period == 0);
    }
    {
        dt_topology_schedule s;
        CHECK_ERR(dt_topology_one_peer_exp(&s, 0), DT_ERR_INVALID_ARG);
        CHECK_ERR(dt_topology_one_peer_exp(NULL, 4), DT_ERR_INVALID_ARG);
        CHECK(dt_topology_schedule_at(0, NULL) == NULL);
        CHECK_OK(dt_topology_one_peer_exp(&s, 4));
        CHECK(dt_topology_schedule_at(-1, &s) == NULL);
        dt_topology_schedule_free(&s);
        dt_topology_schedule_free(NULL);
    }
}

/* dt_topology_check refuses each way a hand-made W can be wrong, naming it. */
static void test_check(void) {
    dt_topology t, bad;
    dt_topology_desc d;
    double w[16];
    int nb[16], off[5], i;
    memset(&d, 0, sizeof d);
    d.kind = DT_TOPO_RING; d.world = 4;
    CHECK_OK(dt_topology_create(&t, &d));
    CHECK_OK(dt_topology_check(&t, 4, "ring"));
    CHECK_ERR(dt_topology_check(&t, 5, "ring"), DT_ERR_INVALID_ARG);
    CHECK(strstr(dt_last_error(), "ring: the topology has 4 ranks, not 5") != NULL);
    CHECK_ERR(dt_topology_check(NULL, 4, "x"), DT_ERR_INVALID_ARG);
    bad = t; bad.weights = w;
    memcpy(w, t.weights, sizeof w);
    w[0 * 4 + 1] += 0.25; w[0 * 4 + 0] -= 0.25;            /* rows still sum to 1 */
    CHECK_ERR(dt_topology_check(&bad, 4, "x"), DT_ERR_INVALID_ARG);
    CHECK(strstr(dt_last_error(), "x: the mixing matrix is not symmetric: W[0][1]") != NULL);
    memcpy(w, t.weights, sizeof w);
    w[0 * 4 + 0] = 0.5;                                    /* row 0 sums to 7/6 */
    CHECK_ERR(dt_topology_check(&bad, 4, "x"), DT_ERR_INVALID_ARG);
    CHECK(strstr(dt_last_error(), "not doubly stochastic: row 0") != NULL);
    memcpy(w, t.weights, sizeof w);
    w[1 * 4 + 1] = -1.0 / 3.0; w[1 * 4 + 0] = w[0 * 4 + 1] = 2.0 / 3.0; w[0] = -1.0 / 3.0;
    CHECK_ERR(dt_topology_check(&bad, 4, "x"), DT_ERR_INVALID_ARG);
    CHECK(strstr(dt_last_error(), "must be >= 0") != NULL);
    memcpy(w, t.weights, sizeof w);                        /* 0 and 2 are not neighbours on a ring of 4 */
    w[0 * 4 + 2] = w[2 * 4 + 0] = 0.125; w[0] -= 0.125; w[2 * 4 + 2] -= 0.125;
    CHECK_ERR(dt_topology_check(&bad, 4, "x"), DT_ERR_INVALID_ARG);
    CHECK(strstr(dt_last_error(), "W[0][2] = 0.125 but 2 is not a neighbour of 0") != NULL);
    bad = t; bad.neighbors = nb; bad.offsets = off;        /* 0 lists 2, which does not list 0 */
    off[0] = 0; off[1] = 3; off[2] = 5; off[3] = 7; off[4] = 9;
    nb[0] = 1; nb[1] = 2; nb[2] = 3; nb[3] = 0; nb[4] = 2; nb[5] = 1; nb[6] = 3; nb[7] = 0; nb[8] = 2;
    CHECK_ERR(dt_topology_check(&bad, 4, "x"), DT_ERR_INVALID_ARG);
    CHECK(strstr(dt_last_error(), "rank 0 lists 2 as a neighbour but 2 does not list 0") != NULL);
    nb[0] = 3; nb[2] = 1;                                  /* not ascending */
    CHECK_ERR(dt_topology_check(&bad, 4, "x"), DT_ERR_INVALID_ARG);
    CHECK(strstr(dt_last_error(), "ascending") != NULL);
    for (i = 0; i < 5; i++) off[i] = t.offsets[i];
    for (i = 0; i < 8; i++) nb[i] = t.neighbors[i];
    CHECK_OK(dt_topology_check(&bad, 4, "x"));            /* the copies are the ring again */
    dt_topology_free(&t);
}

int main(int argc, char **argv) {
    dt_t_only = argc > 1 ? argv[1] : NULL;
    printf("test_topology\n");
    RUN(test_ring);
    RUN(test_torus_exponential_full);
    RUN(test_custom);
    RUN(test_mixing_converges);
    RUN(test_one_peer_exp);
    RUN(test_check);
    return dt_t_summary();
}
