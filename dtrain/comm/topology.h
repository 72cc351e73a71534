/* dtrain/comm/topology.h - gossip topologies, their mixing matrices and eigenvalues, time-varying schedules.
   Part of dtrain v0.1.0, MIT license (see the end of dtrain.h, which is the manual and the one include).

   WHAT IS HERE
     Gossip topologies and their mixing matrices (ring, torus, exponential, full, your own; checked
     symmetric, doubly stochastic and connected), their spectral gap, and time-varying ones
     (dt_topology_schedule: the one-peer exponential graph; each step's matrix checked symmetric and
     doubly stochastic, the period's union connected). Directed graphs (desc.directed) for push-sum, with
     column-stochastic push weights, checked strongly connected; the directed one-peer exponential graph.
     Pure arithmetic on graphs: D-PSGD (dtrain/train/dpsgd.h) sends what they say over the communicator.
   USES
     dtrain/core/base.h only.
   READ FIRST
     dt_topology_create (dt__topology_build), dt_topology_check, dt_topology_one_peer_exp.
*/
#ifndef DTRAIN_TOPOLOGY_H
#define DTRAIN_TOPOLOGY_H
#include "../core/base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The graph over which decentralised algorithms (D-PSGD, gossip) average, and its mixing matrix W:
   rank i's new value is sum_j W[i][j] x_j over itself and its neighbours. A directed graph (desc.directed)
   has one-way edges i -> j (i sends to j, j mixes i's value): W[j][i] != 0 only on them, and its columns
   sum to 1 (what a rank sends out, its mass, is kept), not its rows: only push-sum (dt_dpsgd_desc.push_sum)
   gossips over it. */
typedef enum dt_topology_kind {
    DT_TOPO_RING = 0,      /* i - 1 and i + 1 (mod world): the D-PSGD ring; directed: i -> i + 1 */
    DT_TOPO_TORUS,         /* rows x cols grid with wrap-around: up to 4 neighbours; directed: right and down */
    DT_TOPO_EXPONENTIAL,   /* i +- 2^k (mod world) for 2^k < world: log2(world) hops to anyone; directed:
                              i -> i + 2^k (SGP's exponential graph) */
    DT_TOPO_FULL,          /* everyone: W = 1/world, the same as all-reduce (directed or not) */
    DT_TOPO_CUSTOM         /* the adjacency matrix given in the desc */
} dt_topology_kind;
typedef enum dt_mixing_kind {
    DT_MIXING_UNIFORM = 0, /* W[i][j] = 1 / (deg(i) + 1) for j in {i} u N(i): needs a regular graph */
    DT_MIXING_METROPOLIS   /* W[i][j] = 1 / (1 + max(deg(i), deg(j))), W[i][i] = 1 - the rest: any graph */
} dt_mixing_kind;      /* a directed graph takes push weights: rank i keeps 1 / (outdeg(i) + 1) of its mass and
                          sends as much to each out-neighbour j (W[j][i]); any graph, uniform mixing only */
typedef struct dt_topology_desc {
    dt_topology_kind kind;
    int              world;      /* number of ranks, >= 1 */
    int              rows;       /* torus: rows (must divide world); 0 = the most square factorisation */
    const uint8_t   *adjacency;  /* custom: [world * world], nonzero = edge; must be symmetric unless directed,
                                    where adjacency[i * world + j] nonzero is the edge i -> j */
    dt_mixing_kind   mixing;
    int              directed;   /* 1: one-way edges and column-stochastic push weights, for push-sum */
} dt_topology_desc;
typedef struct dt_topology {
    int     world;
    double *weights;             /* [world, world] mixing matrix */
    int    *offsets;             /* [world + 1]: neighbours of rank i are neighbors[offsets[i] .. offsets[i+1]) */
    int    *neighbors;           /* ascending, without i itself; directed: the in-neighbours, whose values row i
                                    of W mixes (j -> i) */
    double  spectral_gap;        /* 1 - max(|lambda_2|, |lambda_min|) of W: how fast gossip mixes (0 = never);
                                    -1 when not computed (more than 1024 ranks, or a directed graph) */
    double  lambda2;             /* the second largest |eigenvalue| */
    int     directed;            /* 1: W is column stochastic and the edges one-way (the out-lists below) */
    int    *out_offsets;         /* directed: [world + 1], rank i sends to out_neighbors[out_offsets[i] ..
                                    out_offsets[i+1]) (ascending); NULL when undirected (the same as neighbors) */
    int    *out_neighbors;
} dt_topology;
/* Builds the graph and its mixing matrix and checks that W is symmetric, doubly stochastic and the graph
   connected (otherwise DT_ERR_INVALID_ARG naming the rank and what fails, and the fix); computes the
   spectral gap. Directed (desc->directed): W column stochastic with push weights, the graph strongly
   connected (every rank reaches every other along the edges' directions); no spectral gap (-1). *t is
   zeroed on failure. */
dt_result dt_topology_create(dt_topology *t, const dt_topology_desc *desc);
void      dt_topology_free(dt_topology *t);
const char *dt_topology_name(dt_topology_kind k);   /* "ring", "torus", ... */
/* Checks one mixing matrix, as a time-varying topology must pass it at every step: t has world ranks,
   ascending neighbour lists that match (j lists i exactly when i lists j), and W is non-negative,
   symmetric, doubly stochastic and zero off the edges. Directed (t->directed): ascending in- and out-lists
   that match (j sends to i exactly when i receives from j), W non-negative, column stochastic, zero off the
   edges, and W[i][i] > 0 (a rank keeps part of its mass, so push-sum's weight never reaches 0).
   Connectivity is not asked of a single graph (see dt_topology_check_union). DT_ERR_INVALID_ARG naming the
   rank and what fails; fn prefixes the message. */
dt_result dt_topology_check(const dt_topology *t, int world, const char *fn);
/* Checks each of g[0..n) with dt_topology_check and that their union is connected (strongly, along the
   edges' directions, when any is directed): gossip over graphs used in turn then reaches every rank, though
   no single graph need connect them. */
dt_result dt_topology_check_union(const dt_topology *const *g, int n, int world, const char *fn);

/* A time-varying topology: step t gossips over graphs[t mod period] (D-PSGD's dt_dpsgd_desc.schedule). */
typedef struct dt_topology_schedule {
    int          world, period;
    dt_topology *graphs;         /* [period], each with weights 1/2 on its one edge per rank */
} dt_topology_schedule;
/* The one-peer exponential graph: at step t, rank i exchanges with the one peer i xor 2^k, k = t mod period,
   period = ceil(log2 world), with weights 1/2 (itself) and 1/2 (the peer). Each W_t is symmetric and doubly
   stochastic; no single one is connected, their union (the hypercube's edges) is. For world a power of two
   the product of the period's W_t is exactly the averaging matrix (1/world everywhere): any values reach
   their mean in log2 world steps, each rank sending one replica a step. For other worlds a rank whose
   partner i xor 2^k is not a rank sits step k out (W_t[i][i] = 1): the mixing is still symmetric and
   doubly stochastic and reaches consensus geometrically, never exactly. *s is zeroed on failure. */
dt_result dt_topology_one_peer_exp(dt_topology_schedule *s, int world);
void      dt_topology_schedule_free(dt_topology_schedule *s);
/* The directed one-peer exponential graph (Assran et al. 2019): at step t rank i sends to the one peer
   (i + 2^k) mod world and receives from (i - 2^k) mod world, k = t mod period, period = ceil(log2 world),
   keeping half its mass and sending half. Each W_t = (I + S^(2^k)) / 2 (S the cyclic shift) is column (and
   row) stochastic but not symmetric, so only push-sum takes it; the union is strongly connected. For world
   a power of two the period's product is exactly the averaging matrix: values reach their mean in log2
   world steps. *s is zeroed on failure. */
dt_result dt_topology_one_peer_exp_directed(dt_topology_schedule *s, int world);
/* graphs[step mod period] of the dt_topology_schedule *s: a dt_dpsgd_desc.schedule function. */
const dt_topology *dt_topology_schedule_at(int64_t step, void *s);

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_TOPOLOGY_H */

#if defined(DTRAIN_IMPLEMENTATION) && !defined(DTRAIN_TOPOLOGY_IMPLEMENTATION_DONE)
#define DTRAIN_TOPOLOGY_IMPLEMENTATION_DONE

#ifdef __cplusplus
extern "C" {
#endif
#include "../core/internal.h"

const char *dt_topology_name(dt_topology_kind k) {
    static const char *names[] = {"ring", "torus", "exponential", "full", "custom"};
    return (k >= DT_TOPO_RING && k <= DT_TOPO_CUSTOM) ? names[k] : "unknown";
}

void dt_topology_free(dt_topology *t) {
    if (!t) return;
    DT_FREE(t->weights);
    DT_FREE(t->offsets);
    DT_FREE(t->neighbors);
    DT_FREE(t->out_offsets);
    DT_FREE(t->out_neighbors);
    memset(t, 0, sizeof *t);
}

/* Eigenvalues of the symmetric n x n matrix a (destroyed) by cyclic Jacobi rotations, into ev[n]. */
static void dt__sym_eigenvalues(double *a, int n, double *ev) {
    int sweep, p, q, k;
    for (sweep = 0; sweep < 100; sweep++) {
        double off = 0.0;
        for (p = 0; p < n; p++)
            for (q = p + 1; q < n; q++) off += a[p * n + q] * a[p * n + q];
        if (off < 1e-22) break;
        for (p = 0; p < n; p++)
            for (q = p + 1; q < n; q++) {
                double apq = a[p * n + q], theta, t, c, s;
                if (fabs(apq) < 1e-300) continue;
                theta = (a[q * n + q] - a[p * n + p]) / (2.0 * apq);
                t = (theta >= 0 ? 1.0 : -1.0) / (fabs(theta) + sqrt(theta * theta + 1.0));
                c = 1.0 / sqrt(t * t + 1.0);
                s = t * c;
                for (k = 0; k < n; k++) {   /* A <- A J (columns p, q) */
                    double akp = a[k * n + p], akq = a[k * n + q];
                    a[k * n + p] = c * akp - s * akq;
                    a[k * n + q] = s * akp + c * akq;
                }
                for (k = 0; k < n; k++) {   /* A <- J^T A (rows p, q) */
                    double apk = a[p * n + k], aqk = a[q * n + k];
                    a[p * n + k] = c * apk - s * aqk;
                    a[q * n + k] = s * apk + c * aqk;
                }
            }
    }
    for (k = 0; k < n; k++) ev[k] = a[k * n + k];
}

/* How many ranks a search from rank 0 reaches over the union of the edges of g[0..ng), all of world ranks;
   *missing is the first rank it does not reach. -1 when there is no memory for the search. Directed graphs'
   edges are followed forwards (the out-lists) or, back = 1, backwards (the in-lists): which ranks rank 0
   reaches, and which reach it. */
static int dt__topology_reach(const dt_topology *const *g, int ng, int world, int *missing, int back) {
    int *stack = (int *)DT_MALLOC(sizeof(int) * (size_t)world), *seen = (int *)DT_MALLOC(sizeof(int) * (size_t)world);
    int top = 0, reached = 1, q, k;
    if (!stack || !seen) { DT_FREE(stack); DT_FREE(seen); return -1; }
    memset(seen, 0, sizeof(int) * (size_t)world);
    seen[0] = 1;
    stack[top++] = 0;
    while (top) {
        int v = stack[--top];
        for (q = 0; q < ng; q++) {
            int fwd = g[q]->directed && !back;
            const int *off = fwd ? g[q]->out_offsets : g[q]->offsets, *nbr = fwd ? g[q]->out_neighbors : g[q]->neighbors;
            for (k = off[v]; k < off[v + 1]; k++)
                if (!seen[nbr[k]]) { seen[nbr[k]] = 1; reached++; stack[top++] = nbr[k]; }
        }
    }
    for (k = 0; k < world && seen[k]; k++) {}
    *missing = k;
    DT_FREE(stack); DT_FREE(seen);
    return reached;
}

/* Whether the union of g[0..ng) connects every rank to every other (along the edges' directions): DT_OK, or
   DT_ERR_INVALID_ARG saying which rank is cut off, prefixed by fn and what ("the graph", "the union of ..."). */
static dt_result dt__topology_connected(const dt_topology *const *g, int ng, int world, const char *fn, const char *what) {
    int back, missing = 0, reached, directed = 0, q;
    for (q = 0; q < ng; q++) directed |= g[q]->directed;
    for (back = 0; back <= directed; back++) {
        if ((reached = dt__topology_reach(g, ng, world, &missing, back)) < 0) return dt_set_error(DT_ERR_OUT_OF_MEMORY, "%s: no memory", fn);
        if (reached == world) continue;
        if (!directed)
            return dt_set_error(DT_ERR_INVALID_ARG, "%s: %s not connected (rank %d cannot be reached from rank 0): gossip would never "
                                "reach consensus; add edges%s", fn, what, missing, ng > 1 ? " or graphs" : "");
        if (back)
            return dt_set_error(DT_ERR_INVALID_ARG, "%s: %s not strongly connected (rank %d cannot reach rank 0 along the edges): "
                                "push-sum would never reach consensus; add edges%s", fn, what, missing, ng > 1 ? " or graphs" : "");
        return dt_set_error(DT_ERR_INVALID_ARG, "%s: %s not strongly connected (rank 0 cannot reach rank %d along the edges): "
                            "push-sum would never reach consensus; add edges%s", fn, what, missing, ng > 1 ? " or graphs" : "");
    }
    return DT_OK;
}

/* Directed adjacency adj (adj[i * n + j]: i -> j) into t: in-lists (offsets, neighbors), out-lists and push
   weights, W[j][i] = W[i][i] = 1 / (outdeg(i) + 1): every column sums to 1. */
static dt_result dt__topology_push(dt_topology *t, const uint8_t *adj, int n) {
    int i, j, k, nedges = 0;
    for (i = 0; i < n * n; i++) nedges += adj[i];
    t->out_offsets = (int *)DT_MALLOC(sizeof(int) * (size_t)(n + 1));
    t->neighbors = (int *)DT_MALLOC(sizeof(int) * (size_t)(nedges + 1));
    t->out_neighbors = (int *)DT_MALLOC(sizeof(int) * (size_t)(nedges + 1));
    if (!t->out_offsets || !t->neighbors || !t->out_neighbors)
        return dt_set_error(DT_ERR_OUT_OF_MEMORY, "dt_topology_create: no memory for %d edges", nedges);
    t->offsets[0] = t->out_offsets[0] = 0;
    for (i = 0, k = 0; i < n; i++) {   /* in-lists: j -> i */
        for (j = 0; j < n; j++) if (adj[j * n + i]) t->neighbors[k++] = j;
        t->offsets[i + 1] = k;
    }
    for (i = 0, k = 0; i < n; i++) {   /* out-lists: i -> j */
        for (j = 0; j < n; j++) if (adj[i * n + j]) t->out_neighbors[k++] = j;
        t->out_offsets[i + 1] = k;
    }
    memset(t->weights, 0, sizeof(double) * (size_t)n * (size_t)n);
    for (i = 0; i < n; i++) {
        double p = 1.0 / (double)(t->out_offsets[i + 1] - t->out_offsets[i] + 1);
        t->weights[(int64_t)i * n + i] = p;
        for (k = t->out_offsets[i]; k < t->out_offsets[i + 1]; k++) t->weights[(int64_t)t->out_neighbors[k] * n + i] = p;
    }
    t->world = n;
    t->directed = 1;
    t->spectral_gap = t->lambda2 = -1.0;   /* W is not symmetric: its eigenvalues are complex; not computed */
    return DT_OK;
}

/* Builds desc's graph and mixing matrix and checks them. part = 1: one graph of a time-varying topology,
   which need not be connected alone; its spectrum is left to the caller. */
static dt_result dt__topology_build(dt_topology *t, const dt_topology_desc *desc, int part) {
    int n, i, j, rows = 0, cols = 0, nedges = 0;
    uint8_t *adj = NULL;
    double *work = NULL, *ev = NULL;
    dt_result r = DT_OK;
    if (!t) return dt_set_error(DT_ERR_INVALID_ARG, "dt_topology_create: topology is NULL");
    memset(t, 0, sizeof *t);
    if (!desc) return dt_set_error(DT_ERR_INVALID_ARG, "dt_topology_create: desc is NULL");
    n = desc->world;
    if (n < 1 || n > 65536) return dt_set_error(DT_ERR_INVALID_ARG, "dt_topology_create: world is %d; it must be in 1..65536", n);
    if (desc->kind < DT_TOPO_RING || desc->kind > DT_TOPO_CUSTOM)
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_topology_create: unknown topology %d", (int)desc->kind);
    if (desc->mixing != DT_MIXING_UNIFORM && desc->mixing != DT_MIXING_METROPOLIS)
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_topology_create: unknown mixing %d", (int)desc->mixing);
    if (desc->directed && desc->mixing != DT_MIXING_UNIFORM)
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_topology_create: a directed graph takes push weights (each rank keeps "
                            "1 / (outdeg + 1) of its mass and sends as much to each out-neighbour); Metropolis weights need "
                            "undirected edges: leave mixing at DT_MIXING_UNIFORM");
    if (desc->kind == DT_TOPO_CUSTOM && !desc->adjacency)
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_topology_create: a custom topology needs the adjacency matrix [world * world]");
    if (desc->kind == DT_TOPO_TORUS) {
        rows = desc->rows;
        if (rows == 0)   /* the most square factorisation */
            for (rows = (int)sqrt((double)n); rows > 1 && n % rows; rows--) {}
        if (rows < 1 || n % rows)
            return dt_set_error(DT_ERR_INVALID_ARG, "dt_topology_create: a torus of %d ranks cannot have %d rows; rows must "
                                "divide the world size (or be 0 for the most square grid)", n, desc->rows);
        cols = n / rows;
    }
    adj = (uint8_t *)DT_MALLOC((size_t)n * (size_t)n);
    t->weights = (double *)DT_MALLOC(sizeof(double) * (size_t)n * (size_t)n);
    t->offsets = (int *)DT_MALLOC(sizeof(int) * (size_t)(n + 1));
    if (!adj || !t->weights || !t->offsets) { r = dt_set_error(DT_ERR_OUT_OF_MEMORY, "dt_topology_create: no memory for %d ranks", n); goto done; }
    memset(adj, 0, (size_t)n * (size_t)n);
    for (i = 0; i < n; i++) {
        int d;
        switch (desc->kind) {
        case DT_TOPO_RING:   /* directed: the forward edges alone */
            adj[i * n + (i + 1) % n] = 1;
            if (!desc->directed) adj[i * n + (i + n - 1) % n] = 1;
            break;
        case DT_TOPO_TORUS: {
            int rr = i / cols, cc = i % cols;
            adj[i * n + rr * cols + (cc + 1) % cols] = adj[i * n + ((rr + 1) % rows) * cols + cc] = 1;
            if (!desc->directed)
                adj[i * n + rr * cols + (cc + cols - 1) % cols] = adj[i * n + ((rr + rows - 1) % rows) * cols + cc] = 1;
        } break;
        case DT_TOPO_EXPONENTIAL:
            for (d = 1; d < n; d *= 2) {
                adj[i * n + (i + d) % n] = 1;
                if (!desc->directed) adj[i * n + (i + n - d % n) % n] = 1;
            }
            break;
        case DT_TOPO_FULL:
            for (j = 0; j < n; j++) adj[i * n + j] = 1;
            break;
        case DT_TOPO_CUSTOM:
            for (j = 0; j < n; j++) adj[i * n + j] = desc->adjacency[i * n + j] != 0;
            break;
        }
        adj[i * n + i] = 0;   /* self-loops are implicit in W[i][i] */
    }
    if (desc->directed) {   /* push weights; checked as every step of a schedule is, then strongly connected */
        const dt_topology *one = t;
        if ((r = dt__topology_push(t, adj, n)) == DT_OK && (r = dt_topology_check(t, n, "dt_topology_create")) == DT_OK && !part)
            r = dt__topology_connected(&one, 1, n, "dt_topology_create", "the graph is");
        goto done;
    }
    for (i = 0; i < n; i++)
        for (j = 0; j < n; j++)
            if (adj[i * n + j] != adj[j * n + i]) {
                r = dt_set_error(DT_ERR_INVALID_ARG, "dt_topology_create: the adjacency is not symmetric (%d -> %d but not %d -> %d); "
                                 "gossip needs undirected edges", i, j, j, i);
                goto done;
            }
    /* neighbour lists */
    t->offsets[0] = 0;
    for (i = 0; i < n; i++) {
        for (j = 0; j < n; j++) nedges += adj[i * n + j];
        t->offsets[i + 1] = nedges;
    }
    t->neighbors = (int *)DT_MALLOC(sizeof(int) * (size_t)(nedges + 1));
    if (!t->neighbors) { r = dt_set_error(DT_ERR_OUT_OF_MEMORY, "dt_topology_create: no memory for %d edges", nedges); goto done; }
    for (i = 0, nedges = 0; i < n; i++)
        for (j = 0; j < n; j++)
            if (adj[i * n + j]) t->neighbors[nedges++] = j;
    /* mixing weights */
    for (i = 0; i < n; i++) {
        int di = t->offsets[i + 1] - t->offsets[i];
        double rest = 1.0;
        for (j = 0; j < n; j++) {
            int dj = t->offsets[j + 1] - t->offsets[j];
            double w = 0.0;
            if (adj[i * n + j]) w = desc->mixing == DT_MIXING_UNIFORM ? 1.0 / (di + 1) : 1.0 / (1 + (di > dj ? di : dj));
            t->weights[i * n + j] = w;
            rest -= w;
        }
        t->weights[i * n + i] = rest;
    }
    for (i = 0; i < n; i++) {   /* symmetric and doubly stochastic (rows sum to 1 by construction) */
        double col = 0.0;
        for (j = 0; j < n; j++) {
            col += t->weights[j * n + i];
            if (fabs(t->weights[i * n + j] - t->weights[j * n + i]) > 1e-12) {
                r = dt_set_error(DT_ERR_INVALID_ARG, "dt_topology_create: the %s mixing matrix is not symmetric (ranks %d and %d "
                                 "have degrees %d and %d): use DT_MIXING_METROPOLIS for graphs that are not regular",
                                 desc->mixing == DT_MIXING_UNIFORM ? "uniform" : "Metropolis", i, j,
                                 t->offsets[i + 1] - t->offsets[i], t->offsets[j + 1] - t->offsets[j]);
                goto done;
            }
        }
        if (fabs(col - 1.0) > 1e-9 || t->weights[i * n + i] < -1e-12) {
            r = dt_set_error(DT_ERR_INVALID_ARG, "dt_topology_create: the mixing matrix is not doubly stochastic at rank %d "
                             "(column sum %g, self weight %g)", i, col, t->weights[i * n + i]);
            goto done;
        }
    }
    t->world = n;
    if (part) goto done;
    {   /* connected: a search from rank 0 reaches everyone */
        const dt_topology *one = t;
        if ((r = dt__topology_connected(&one, 1, n, "dt_topology_create", "the graph is")) != DT_OK) goto done;
    }
    /* spectral gap from the eigenvalues of W (symmetric, so real); Jacobi costs O(world^3) per sweep, so
       beyond 1024 ranks the gap is left at -1 (not computed) */
    if (n > 1024) { t->spectral_gap = t->lambda2 = -1.0; goto done; }
    work = (double *)DT_MALLOC(sizeof(double) * (size_t)n * (size_t)n);
    ev = (double *)DT_MALLOC(sizeof(double) * (size_t)n);
    if (!work || !ev) { r = dt_set_error(DT_ERR_OUT_OF_MEMORY, "dt_topology_create: no memory for the spectrum"); goto done; }
    memcpy(work, t->weights, sizeof(double) * (size_t)n * (size_t)n);
    dt__sym_eigenvalues(work, n, ev);
    {
        /* the largest eigenvalue is 1 (the consensus direction); lambda2 is the largest |ev| among the rest */
        int top1 = 0, k;
        double l2 = 0.0;
        for (k = 1; k < n; k++) if (ev[k] > ev[top1]) top1 = k;
        for (k = 0; k < n; k++) if (k != top1 && fabs(ev[k]) > l2) l2 = fabs(ev[k]);
        t->lambda2 = l2;
        t->spectral_gap = 1.0 - l2;
    }
    t->world = n;
done:
    DT_FREE(adj); DT_FREE(work); DT_FREE(ev);
    if (r != DT_OK) dt_topology_free(t);
    return r;
}

dt_result dt_topology_create(dt_topology *t, const dt_topology_desc *desc) { return dt__topology_build(t, desc, 0); }

/* Whether rank i's ascending list (off, nbr: neighbours, in- or out-neighbours) holds j. */
static int dt__topology_holds(const int *off, const int *nbr, int i, int j) {
    int lo = off[i], hi = off[i + 1];
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (nbr[mid] == j) return 1;
        if (nbr[mid] < j) lo = mid + 1; else hi = mid;
    }
    return 0;
}
static int dt__topology_lists(const dt_topology *t, int i, int j) { return dt__topology_holds(t->offsets, t->neighbors, i, j); }

/* dt_topology_check of a directed graph: in- and out-lists ascending and matching, W non-negative, column
   stochastic, zero off the edges, a positive share kept. */
static dt_result dt__topology_check_push(const dt_topology *t, int n, const char *fn) {
    int i, j, k, way;
    if (!t->out_offsets || !t->out_neighbors)
        return dt_set_error(DT_ERR_INVALID_ARG, "%s: the directed topology has no out-neighbour lists: build it with "
                            "dt_topology_create (desc.directed = 1)", fn);
    for (way = 0; way < 2; way++) {   /* 0: in-lists (j -> i), 1: out-lists (i -> j) */
        const int *off = way ? t->out_offsets : t->offsets, *nbr = way ? t->out_neighbors : t->neighbors;
        const int *eoff = way ? t->offsets : t->out_offsets, *enbr = way ? t->neighbors : t->out_neighbors;
        for (i = 0; i < n; i++) {
            if (off[i] < 0 || off[i + 1] < off[i] || (i == 0 && off[0] != 0))
                return dt_set_error(DT_ERR_INVALID_ARG, "%s: the %s-neighbour offsets of rank %d do not ascend from 0", fn,
                                    way ? "out" : "in", i);
            for (k = off[i]; k < off[i + 1]; k++) {
                j = nbr[k];
                if (j < 0 || j >= n || j == i || (k > off[i] && j <= nbr[k - 1]))
                    return dt_set_error(DT_ERR_INVALID_ARG, "%s: rank %d's %s-neighbour list must hold other ranks in ascending "
                                        "order, and holds %d at position %d", fn, i, way ? "out" : "in", j, k - off[i]);
                if (!dt__topology_holds(eoff, enbr, j, i))
                    return dt_set_error(DT_ERR_INVALID_ARG, "%s: rank %d %s %d but %d does not list the edge %d -> %d: the "
                                        "in- and out-lists must name the same edges", fn, i, way ? "sends to" : "receives from",
                                        j, j, way ? i : j, way ? j : i);
            }
        }
    }
    for (i = 0; i < n; i++) {
        double col = 0.0;
        for (j = 0; j < n; j++) {
            double w = t->weights[(int64_t)j * n + i];   /* the share of i's mass that j gets */
            col += w;
            if (!(w >= 0.0))
                return dt_set_error(DT_ERR_INVALID_ARG, "%s: W[%d][%d] is %g: push weights must be >= 0", fn, j, i, w);
            if (w != 0.0 && j != i && !dt__topology_holds(t->offsets, t->neighbors, j, i))
                return dt_set_error(DT_ERR_INVALID_ARG, "%s: W[%d][%d] = %g but there is no edge %d -> %d: a weight off the "
                                    "graph mixes a value that is never sent", fn, j, i, w, i, j);
        }
        if (!(t->weights[(int64_t)i * n + i] > 0.0))
            return dt_set_error(DT_ERR_INVALID_ARG, "%s: W[%d][%d] is %g: a rank must keep a share of its own mass (> 0), or "
                                "push-sum's weight could reach 0", fn, i, i, t->weights[(int64_t)i * n + i]);
        if (fabs(col - 1.0) > 1e-9)
            return dt_set_error(DT_ERR_INVALID_ARG, "%s: the push weights are not column stochastic: column %d (what rank %d "
                                "keeps and sends) sums to %.17g, not 1, so push-sum would not keep the sum", fn, i, i, col);
    }
    return DT_OK;
}

dt_result dt_topology_check(const dt_topology *t, int world, const char *fn) {
    int n, i, j, k;
    if (!fn) fn = "dt_topology_check";
    if (!t || !t->weights || !t->offsets || !t->neighbors)
        return dt_set_error(DT_ERR_INVALID_ARG, "%s: the topology is %s: build it with dt_topology_create", fn, t ? "empty" : "NULL");
    if ((n = t->world) != world)
        return dt_set_error(DT_ERR_INVALID_ARG, "%s: the topology has %d ranks, not %d: give dt_topology_desc.world = %d", fn, n,
                            world, world);
    if (t->directed) return dt__topology_check_push(t, n, fn);
    for (i = 0; i < n; i++) {
        double row = 0.0;
        if (t->offsets[i] < 0 || t->offsets[i + 1] < t->offsets[i] || (i == 0 && t->offsets[0] != 0))
            return dt_set_error(DT_ERR_INVALID_ARG, "%s: the neighbour offsets of rank %d do not ascend from 0", fn, i);
        for (k = t->offsets[i]; k < t->offsets[i + 1]; k++) {
            j = t->neighbors[k];
            if (j < 0 || j >= n || j == i || (k > t->offsets[i] && j <= t->neighbors[k - 1]))
                return dt_set_error(DT_ERR_INVALID_ARG, "%s: rank %d's neighbour list must hold other ranks in ascending order, "
                                    "and holds %d at position %d", fn, i, j, k - t->offsets[i]);
            if (!dt__topology_lists(t, j, i))
                return dt_set_error(DT_ERR_INVALID_ARG, "%s: rank %d lists %d as a neighbour but %d does not list %d: gossip needs "
                                    "undirected edges", fn, i, j, j, i);
        }
        for (j = 0; j < n; j++) {
            double w = t->weights[(int64_t)i * n + j];
            row += w;
            if (!(w >= 0.0))
                return dt_set_error(DT_ERR_INVALID_ARG, "%s: W[%d][%d] is %g: mixing weights must be >= 0", fn, i, j, w);
            if (fabs(w - t->weights[(int64_t)j * n + i]) > 1e-12)
                return dt_set_error(DT_ERR_INVALID_ARG, "%s: the mixing matrix is not symmetric: W[%d][%d] = %g but W[%d][%d] = %g",
                                    fn, i, j, w, j, i, t->weights[(int64_t)j * n + i]);
            if (w != 0.0 && j != i && !dt__topology_lists(t, i, j))
                return dt_set_error(DT_ERR_INVALID_ARG, "%s: W[%d][%d] = %g but %d is not a neighbour of %d: a weight off the "
                                    "graph mixes a replica that is never sent", fn, i, j, w, j, i);
        }
        if (fabs(row - 1.0) > 1e-9)
            return dt_set_error(DT_ERR_INVALID_ARG, "%s: the mixing matrix is not doubly stochastic: row %d (and, W being "
                                "symmetric, column %d) sums to %.17g, not 1, so gossip would not keep the mean", fn, i, i, row);
    }
    return DT_OK;
}

dt_result dt_topology_check_union(const dt_topology *const *g, int n, int world, const char *fn) {
    int q;
    char what[64];
    dt_result r;
    if (!fn) fn = "dt_topology_check_union";
    if (!g || n < 1) return dt_set_error(DT_ERR_INVALID_ARG, "%s: no graphs to check (%d)", fn, n);
    for (q = 0; q < n; q++)
        if ((r = dt_topology_check(g[q], world, fn)) != DT_OK) return r;
    snprintf(what, sizeof what, "the union of the %d graphs is", n);
    return dt__topology_connected(g, n, world, fn, what);
}

void dt_topology_schedule_free(dt_topology_schedule *s) {
    int k;
    if (!s) return;
    for (k = 0; s->graphs && k < s->period; k++) dt_topology_free(&s->graphs[k]);
    DT_FREE(s->graphs);
    memset(s, 0, sizeof *s);
}

/* The one-peer exponential schedules: step k's peer is i xor 2^k (undirected, a pairing), or directed
   i -> i + 2^k (mod world). fn names the caller in messages. */
static dt_result dt__topology_one_peer(dt_topology_schedule *s, int world, int directed, const char *fn) {
    dt_topology_desc d;
    uint8_t *adj;
    int k, i, period = 1;
    dt_result r = DT_OK;
    if (!s) return dt_set_error(DT_ERR_INVALID_ARG, "%s: schedule is NULL", fn);
    memset(s, 0, sizeof *s);
    if (world < 1 || world > 65536) return dt_set_error(DT_ERR_INVALID_ARG, "%s: world is %d; it must be in 1..65536", fn, world);
    while ((1 << period) < world) period++;   /* ceil(log2 world), at least 1 */
    adj = (uint8_t *)DT_MALLOC((size_t)world * (size_t)world);
    s->graphs = (dt_topology *)DT_MALLOC(sizeof(dt_topology) * (size_t)period);
    if (!adj || !s->graphs) {
        DT_FREE(adj); DT_FREE(s->graphs); s->graphs = NULL;
        return dt_set_error(DT_ERR_OUT_OF_MEMORY, "%s: no memory for %d ranks", fn, world);
    }
    memset(s->graphs, 0, sizeof(dt_topology) * (size_t)period);
    s->world = world;
    s->period = period;
    memset(&d, 0, sizeof d);
    /* uniform: 1/2 on both ends of each edge; directed: push weights, half kept and half sent */
    d.kind = DT_TOPO_CUSTOM; d.world = world; d.adjacency = adj; d.directed = directed;
    for (k = 0; k < period && r == DT_OK; k++) {
        memset(adj, 0, (size_t)world * (size_t)world);
        for (i = 0; i < world; i++)
            if (directed) adj[(int64_t)i * world + (i + (1 << k)) % world] = 1;   /* world 1: a self-loop, dropped */
            else if ((i ^ (1 << k)) < world) adj[(int64_t)i * world + (i ^ (1 << k))] = 1;
        r = dt__topology_build(&s->graphs[k], &d, 1);
        if (r != DT_OK || directed) continue;   /* a directed W's spectrum is not computed (-1) */
        /* W is a pairing: eigenvalue 1 for each pair's mean and each rank alone, 0 for each pair's difference */
        s->graphs[k].lambda2 = world > 2 ? 1.0 : 0.0;
        s->graphs[k].spectral_gap = 1.0 - s->graphs[k].lambda2;
    }
    DT_FREE(adj);
    if (r != DT_OK) dt_topology_schedule_free(s);
    return r;
}

dt_result dt_topology_one_peer_exp(dt_topology_schedule *s, int world) {
    return dt__topology_one_peer(s, world, 0, "dt_topology_one_peer_exp");
}

dt_result dt_topology_one_peer_exp_directed(dt_topology_schedule *s, int world) {
    return dt__topology_one_peer(s, world, 1, "dt_topology_one_peer_exp_directed");
}

const dt_topology *dt_topology_schedule_at(int64_t step, void *s) {
    const dt_topology_schedule *q = (const dt_topology_schedule *)s;
    if (!q || !q->graphs || q->period < 1 || step < 0) return NULL;
    return &q->graphs[step % q->period];
}

#ifdef __cplusplus
}
#endif
#endif /* the implementation */
