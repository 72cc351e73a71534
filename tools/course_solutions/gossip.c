/* tools/course_solutions/gossip.c - the reference solution of assignment 2 (docs/course/assignments/gossip.md),
   for instructors: not part of what students are given. make assignment-test A=gossip SOLUTIONS=1 runs the
   harness on it. */
#include <stdlib.h>
#include "assignments.h"

#define TAG 36

dt_result student_gossip_step(dt_comm *c, const dt_topology *g, float *x, int64_t n) {
    int me = dt_comm_rank(c), deg = g->offsets[me + 1] - g->offsets[me], q;
    const int *nb = g->neighbors + g->offsets[me];   /* ascending, without me */
    const double *w = g->weights + (int64_t)me * g->world;   /* row me of W */
    float *recv = (float *)malloc(sizeof(float) * (size_t)(deg * n + 1));
    dt_request *req = (dt_request *)calloc((size_t)(2 * deg + 1), sizeof *req);
    dt_result r = DT_OK, rw;
    int64_t k;
    if (!recv || !req) {
        free(recv); free(req);
        return dt_set_error(DT_ERR_OUT_OF_MEMORY, "student_gossip_step: rank %d: no memory for %d replicas", me, deg);
    }
    /* my replica to every neighbour, theirs from every neighbour: recv [deg, n], in the order of nb */
    for (q = 0; q < deg && r == DT_OK; q++) {
        r = dt_comm_irecv(c, recv + (int64_t)q * n, (size_t)n, DT_F32, nb[q], TAG, &req[deg + q]);
        if (r == DT_OK) r = dt_comm_isend(c, x, (size_t)n, DT_F32, nb[q], TAG, &req[q]);
    }
    rw = dt_comm_waitall(c, req, 2 * deg);   /* also after a failure: it withdraws what is still pending */
    if (r == DT_OK) r = rw;
    /* x[k] = sum over j ascending (me in its place) of W[me][j] x_j[k], in double */
    for (k = 0; k < n && r == DT_OK; k++) {
        double acc = 0.0;
        int mine = 0;
        for (q = 0; q < deg || !mine;) {
            if (!mine && (q == deg || nb[q] > me)) { acc += w[me] * (double)x[k]; mine = 1; }
            else { acc += w[nb[q]] * (double)recv[(int64_t)q * n + k]; q++; }
        }
        x[k] = (float)acc;
    }
    free(recv);
    free(req);
    return r;
}
