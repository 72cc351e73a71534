/* assignments.h - the functions the course's coding assignments ask for (docs/course/assignments/README.md).
   Each is written by the student in this directory (ring_allreduce.c, gossip.c, aggregate.c, which start as
   stubs), and checked by the harness of the same name (test_ring_allreduce.c, ...) against the library's own
   implementation, bit for bit and by the traffic counters. Do not change these declarations: the harnesses
   call them as they are. */
#ifndef COURSE_ASSIGNMENTS_H
#define COURSE_ASSIGNMENTS_H
#include "dtrain.h"

/* Assignment 1 (chapter 1, ring_allreduce.md). Collective: every rank of c calls it with the same n.
   buf [n] floats: in, this rank's vector; out, the element-wise sum of every rank's vector, with the bits
   dt_comm_allreduce(c, buf, n, DT_F32, DT_SUM, DT_ALGO_RING) gives, and the same bytes on the wire.
   Only dt_comm_isend, dt_comm_irecv, dt_comm_wait / dt_comm_waitall, dt_comm_rank and dt_comm_size. */
dt_result student_ring_allreduce(dt_comm *c, float *buf, int64_t n);

/* Assignment 2 (chapter 2, gossip.md). Collective: every rank of c calls it with the same g and n.
   x [n] floats: in, this rank's replica x_i; out, sum over j of W[i][j] x_j (g's mixing matrix, j over this
   rank and its neighbours in g), with the bits of dt_dpsgd_step(d, NULL) and the same bytes on the wire.
   g is undirected (g->directed is 0). Point-to-point calls or dt_comm_neighbor_exchange. */
dt_result student_gossip_step(dt_comm *c, const dt_topology *g, float *x, int64_t n);

/* Assignment 3 (chapter 3, aggregate.md). Local (no communication). updates [n] pointers to [len] floats.
   Trimmed mean: out [len] = coordinate-wise mean of each column without its t = floor(trim * n) lowest and t
   highest values, with the bits of dt_fed_aggregate's DT_FED_TRIMMED; DT_ERR_INVALID_ARG (out untouched)
   where the library refuses: trim outside [0, 0.5), or 2 t >= n. */
dt_result student_trimmed_mean(const float *const *updates, int n, int64_t len, float trim, float *out);
/* Krum with f Byzantine clients: *chosen = the client whose summed squared distance to its n - f - 2 nearest
   others is smallest (ties: the lower index), out [len] = its update, as dt_fed_aggregate's DT_FED_KRUM;
   DT_ERR_INVALID_ARG (out and *chosen untouched) where the library refuses: f < 0, or n < 2 f + 3. */
dt_result student_krum(const float *const *updates, int n, int64_t len, int f, float *out, int *chosen);

#endif
