/* tools/course_solutions/ring_allreduce.c - the reference solution of assignment 1
   (docs/course/assignments/ring_allreduce.md), for instructors: not part of what students are given.
   make assignment-test A=ring_allreduce SOLUTIONS=1 runs the harness on it. */
#include <stdlib.h>
#include <string.h>
#include "assignments.h"

#define TAG 36   /* any user tag (0 .. DT_TAG_USER_MAX): messages of one pair and tag arrive in the order sent */

/* Chunk k of n elements over p ranks: the first n % p chunks have one element more (the library's split). */
static int64_t chunk_off(int64_t n, int p, int k) { return k * (n / p) + (k < n % p ? k : n % p); }
static int64_t chunk_len(int64_t n, int p, int k) { return n / p + (k < n % p ? 1 : 0); }
static int mod(int a, int p) { return (a % p + p) % p; }

/* One step: send[ns] to dst while recv[nr] comes from src; waits for both. */
static dt_result exchange(dt_comm *c, const float *send, int64_t ns, int dst, float *recv, int64_t nr, int src) {
    dt_request q[2];
    dt_result r, rw;
    memset(q, 0, sizeof q);   /* zeroed: "none", which a wait completes at once */
    r = dt_comm_irecv(c, recv, (size_t)nr, DT_F32, src, TAG, &q[1]);
    if (r == DT_OK) r = dt_comm_isend(c, send, (size_t)ns, DT_F32, dst, TAG, &q[0]);
    rw = dt_comm_waitall(c, q, 2);   /* also after a failure: it withdraws what is still pending */
    return r != DT_OK ? r : rw;
}

dt_result student_ring_allreduce(dt_comm *c, float *buf, int64_t n) {
    int p = dt_comm_size(c), me = dt_comm_rank(c), right = mod(me + 1, p), left = mod(me - 1, p), s;
    float *tmp;
    dt_result r = DT_OK;
    if (p == 1) return DT_OK;
    tmp = (float *)malloc(sizeof(float) * (size_t)(n / p + 1));
    if (!tmp) return dt_set_error(DT_ERR_OUT_OF_MEMORY, "student_ring_allreduce: rank %d: no memory for %lld floats", me,
                                  (long long)(n / p + 1));
    /* reduce-scatter: step s sends chunk me - s - 1 and adds chunk me - s - 2 from the left into its own, so
       chunk k starts at rank k + 1, gains one rank per step and ends complete at rank k */
    for (s = 0; s < p - 1 && r == DT_OK; s++) {
        int ks = mod(me - s - 1, p), kr = mod(me - s - 2, p);
        int64_t i, off = chunk_off(n, p, kr), len = chunk_len(n, p, kr);
        r = exchange(c, buf + chunk_off(n, p, ks), chunk_len(n, p, ks), right, tmp, len, left);
        if (r == DT_OK) for (i = 0; i < len; i++) buf[off + i] = buf[off + i] + tmp[i];
    }
    /* all-gather: rank me starts with chunk me complete and passes on what it has last received */
    for (s = 0; s < p - 1 && r == DT_OK; s++) {
        int ks = mod(me - s, p), kr = mod(me - s - 1, p);
        r = exchange(c, buf + chunk_off(n, p, ks), chunk_len(n, p, ks), right, buf + chunk_off(n, p, kr), chunk_len(n, p, kr), left);
    }
    free(tmp);
    return r;
}
