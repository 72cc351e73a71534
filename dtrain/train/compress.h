/* dtrain/train/compress.h - DDP's gradient compression: bf16, fp16, top-k and PowerSGD with error feedback.
   Part of dtrain v0.1.0, MIT license (see the end of dtrain.h, which is the manual and the one include).

   WHAT IS HERE
     The kinds of dt_ddp_desc.compress and their parsing; dt_topk_split (a radix select); and the four
     compressors behind one small private interface (dt__compress), each replacing the all-reduce of one
     slice of DDP's weighted gradient, so a bucket is compressed and sent as soon as backward finishes it.
   USES
     dtrain/core/nn.h (the tensors' shapes) and dtrain/comm/comm.h, and what they include.
   READ FIRST
     dt__compress_slice, then dt__compress_topk and dt__compress_powersgd.
*/
#ifndef DTRAIN_COMPRESS_H
#define DTRAIN_COMPRESS_H
#include "../core/nn.h"
#include "../comm/comm.h"
#include "checkpoint.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What the all-reduce methods (BUCKETS, FLAT, PER_LAYER) put on the wire for each slice of the weighted
   gradient (the slice this rank sums with the others'). Each compresses one slice at a time, so buckets
   still overlap backward. With one rank nothing is sent and nothing is compressed.
     FP32  the floats (the default)
     BF16  each float rounded to bfloat16 (nearest, ties to even) by this rank, summed by the all-reduce
           over DT_BF16: every addition decodes to float, adds in float and rounds the partial sum to
           bfloat16 before it travels on (the ring's reduce-scatter: p - 1 roundings); decoded at the end.
           The two sample counts, which 16 bits would not count exactly, go first in an all-reduce of two
           floats of their own (in the sync's first collective)
     FP16  the same with IEEE half (5 exponent bits, largest 65504), with each rank's weighted slice divided by the
           samples of all ranks before it travels (the counts' all-reduce comes first, so every rank knows them):
           the sum arrives as the average, which DDP then does not divide again (dt__compress_averaged), and a
           gradient overflows only when the average would, not when a rank's share times its samples does
     TOPK  top-k sparsification with error feedback (Stich et al. 2018): this rank adds its residual (what
           it has not sent yet) to the slice, keeps the k = ceil(topk_ratio x slice) entries of largest
           magnitude (dt_topk_split; ties to the lower index), sends them as (index, value) pairs in an
           all-gather (with the two counts after them), and keeps the rest as the next sync's residual;
           every rank then sums everyone's pairs into a zeroed slice in rank order, so all get the same
           bits. no_feedback drops the rest instead (plain top-k, to compare).
     POWERSGD  rank-r PowerSGD with error feedback (Vogels et al. 2019) for each matrix-shaped tensor of the
           slice (a weight [out, in], a conv weight as [out, in k k]; where (rows + cols) r < rows cols):
           M = slice + residual; P = M Q summed over the ranks (one all-reduce of floats, with the slice's
           vectors, sent as they are, and the counts), orthonormalized; Q = M^T P summed (a second
           all-reduce); the slice becomes P Q^T and the residual M - P Q^T / p. Q starts from the seeded
           same values on every rank and is kept from step to step (one power iteration per step).
   The communicator's counters count what travels: 2 bytes an element for BF16 and FP16, (4 + 4) bytes a
   pair for TOPK, 4 (rows + cols) r bytes a matrix for POWERSGD, and the local backend's link model charges
   those sizes. */
typedef enum dt_ddp_compress {
    DT_DDP_FP32 = 0, DT_DDP_BF16, DT_DDP_FP16, DT_DDP_TOPK, DT_DDP_POWERSGD, DT_DDP_COMPRESS_COUNT
} dt_ddp_compress;
const char *dt_ddp_compress_name(dt_ddp_compress k);         /* "fp32", "bf16", "fp16", "topk", "powersgd" */
/* Parses "fp32", "bf16", "fp16", "topk", "topk:RATIO" (RATIO in (0, 1], e.g. 0.01), "powersgd" or
   "powersgd:R" (R a whole number from 1 to 1024); *param (may be NULL) gets RATIO or R, or 0 (the default) when none
   is given. */
dt_result   dt_ddp_compress_parse(const char *s, dt_ddp_compress *out, double *param);
#define DT_DDP_TOPK_RATIO 0.01   /* TOPK's default fraction: 1% of each slice */
#define DT_DDP_POWERSGD_RANK 2   /* POWERSGD's default rank */
/* Top-k of x [n] by magnitude: the k entries of largest |x[i]| (equal magnitudes: the lower index first)
   go to idx [k] (ascending) and val [k], and become 0 in x, which is left holding the rest exactly (x in =
   x out + the pairs scattered). k is clipped to 0..n; returns it. O(n): a radix select on the magnitudes'
   bits, then one pass. */
int64_t dt_topk_split(float *x, int64_t n, int64_t k, int32_t *idx, float *val);

/* Internal (the interface DDP uses; not the API).
   One dt__compress per dt_ddp that compresses (more than one rank): DDP fills in the settings and its plan,
   dt__compress_alloc makes the buffers, dt__compress_slice replaces the all-reduce of one slice of the
   weighted gradient (a bucket, a tensor or the buffer), dt__compress_free frees what alloc made. The first
   slice of a sync also sums this rank's samples and activity; the compressor hands the sums to DDP's
   counts(user, total, nactive) as soon as it has them (a failure there stops the sync). DDP reads residual
   and nstate: the state its checkpoints keep. */
typedef struct dt__compress {
    /* settings (from dt_ddp_desc, defaults filled in) */
    dt_ddp_compress kind;           /* BF16, FP16, TOPK or POWERSGD */
    dt_algo      algo;              /* of the all-reduces */
    double       topk_ratio;
    int          no_feedback, powersgd_rank;
    /* DDP's plan, borrowed */
    dt_comm     *comm;
    const dt_model *model;          /* POWERSGD: the tensors' shapes */
    int64_t      n;                 /* gradient elements */
    int          ntensors;
    const int64_t *toff, *tcnt;     /* [ntensors] parameter tensors, last first */
    dt_result  (*counts)(void *user, float total, float nactive);
    void        *user;
    /* the slice being reduced: whether this rank has data, and its samples (set by dt__compress_slice) */
    int          active;
    int64_t      acc_samples;
    /* state */
    uint16_t    *half;              /* BF16, FP16: [largest slice] the slice as it travels */
    float        total;             /* BF16, FP16: the samples of all ranks in this sync (after its first slice) */
    float       *residual;          /* TOPK with feedback: [n] what this rank has not sent yet */
    int32_t     *sel_idx;           /* TOPK: [largest k] the pairs chosen */
    float       *sel_val;
    int32_t     *wire, *gathered_wire;  /* TOPK: [2 k + 2] this rank's pairs and counts; [size (2 kmax + 2)] everyone's */
    int64_t     *mrows, *mcols, *qoff;  /* POWERSGD: [ntensors + 1] in toff's order: a matrix's shape (0: sent as
                                           it is) and where its Q starts in psq */
    float       *psq;               /* POWERSGD: the Qs, after the residual's n floats (one block: both are saved) */
    float       *psbuf;             /* POWERSGD: [largest slice's Ps and vectors + 2] */
    int64_t      nstate;            /* floats of residual (and POWERSGD's Qs) that a checkpoint keeps */
} dt__compress;
#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_COMPRESS_H */

#if defined(DTRAIN_IMPLEMENTATION) && !defined(DTRAIN_COMPRESS_IMPLEMENTATION_DONE)
#define DTRAIN_COMPRESS_IMPLEMENTATION_DONE

#ifdef __cplusplus
extern "C" {
#endif
#include "../core/internal.h"

static const char *const dt__ddp_compress_names[DT_DDP_COMPRESS_COUNT] = {"fp32", "bf16", "fp16", "topk", "powersgd"};
const char *dt_ddp_compress_name(dt_ddp_compress k) { return dt__enum_name(dt__ddp_compress_names, DT_DDP_COMPRESS_COUNT, (int)k); }

dt_result dt_ddp_compress_parse(const char *s, dt_ddp_compress *out, double *param) {
    char name[16], *end = NULL;
    const char *colon = s ? strchr(s, ':') : NULL;
    double x = 0.0;
    int k = 0;
    dt_result r;
    if (colon && (size_t)(colon - s) < sizeof name) {
        snprintf(name, sizeof name, "%.*s", (int)(colon - s), s);
        s = name;
    }
    if ((r = dt__enum_parse(dt__ddp_compress_names, DT_DDP_COMPRESS_COUNT, s, &k,
                            "DDP compression (topk:RATIO, powersgd:RANK for a parameter)")) != DT_OK) return r;
    if (colon) {
        x = strtod(colon + 1, &end);
        if ((k != DT_DDP_TOPK && k != DT_DDP_POWERSGD) || end == colon + 1 || *end || !(x > 0.0) ||
            (k == DT_DDP_TOPK && x > 1.0) || (k == DT_DDP_POWERSGD && (x != floor(x) || x > 1024.0)))
            return dt_set_error(DT_ERR_INVALID_ARG, "DDP compression '%s%s': only topk takes a ratio, a number in (0, 1] "
                                "(e.g. topk:0.01 sends 1%% of each slice), and powersgd a rank, a whole number from 1 to "
                                "1024 (e.g. powersgd:2)", s, colon);
    }
    if (out) *out = (dt_ddp_compress)k;
    if (param) *param = x;
    return DT_OK;
}

/* The k-th largest of the keys |x[i]| (a float's magnitude orders as its bits), a byte at a time from the
   top; *take gets how many entries equal to it belong to the top k (the first ones, by index). */
static uint32_t dt__topk_threshold(const float *x, int64_t n, int64_t k, int64_t *take) {
    uint32_t prefix = 0, mask = 0;
    int64_t want = k, hist[256], i;
    int shift, b = 0;
    for (shift = 24; shift >= 0; shift -= 8) {
        memset(hist, 0, sizeof hist);
        for (i = 0; i < n; i++) {
            uint32_t u;
            memcpy(&u, &x[i], sizeof u);
            u &= 0x7fffffffu;
            if ((u & mask) == prefix) hist[(u >> shift) & 255u]++;
        }
        for (b = 255; b > 0 && want > hist[b]; b--) want -= hist[b];
        prefix |= (uint32_t)b << shift;
        mask |= 255u << shift;
    }
    *take = want;
    return prefix;
}

int64_t dt_topk_split(float *x, int64_t n, int64_t k, int32_t *idx, float *val) {
    int64_t take, i, got = 0;
    uint32_t t;
    if (k <= 0 || n <= 0) return 0;
    if (k > n) k = n;
    t = dt__topk_threshold(x, n, k, &take);
    for (i = 0; i < n && got < k; i++) {
        uint32_t u;
        memcpy(&u, &x[i], sizeof u);
        u &= 0x7fffffffu;
        if (u > t || (u == t && take-- > 0)) {
            idx[got] = (int32_t)i;
            val[got++] = x[i];
            x[i] = 0.0f;
        }
    }
    return got;
}

/* ---- the interface DDP uses: dt__compress (above, in the declarations) ---- */

/* BF16 and FP16: the slice rounded to 16 bits, summed over DT_BF16 or DT_F16 (partial sums rounded as they
   travel), decoded; the first collective's counts go before it as two floats. */
static dt_result dt__compress_half(dt__compress *d, int i, float *g, int64_t cnt) {
    int bf = d->kind == DT_DDP_BF16;
    float counts[2];
    int64_t j;
    dt_result r;
    if (i == 0) {
        counts[0] = d->active ? (float)d->acc_samples : 0.0f;
        counts[1] = (float)d->active;
        if ((r = dt_comm_allreduce(d->comm, counts, 2, DT_F32, DT_SUM, d->algo)) != DT_OK) return r;
        if ((r = d->counts(d->user, counts[0], counts[1])) != DT_OK) return r;
        d->total = counts[0];
    }
    if (bf) for (j = 0; j < cnt; j++) d->half[j] = dt_bf16_from_float(g[j]);
    else if (d->total > 0.0f) for (j = 0; j < cnt; j++) d->half[j] = dt_f16_from_float(g[j] / d->total);   /* the average's share */
    else for (j = 0; j < cnt; j++) d->half[j] = dt_f16_from_float(g[j]);   /* nobody has data: zeros */
    if ((r = dt_comm_allreduce(d->comm, d->half, (size_t)cnt, bf ? DT_BF16 : DT_F16, DT_SUM, d->algo)) != DT_OK) return r;
    for (j = 0; j < cnt; j++) g[j] = bf ? dt_bf16_to_float(d->half[j]) : dt_f16_to_float(d->half[j]);
    return DT_OK;
}

/* Whether a sync's summed slices are already the average (FP16 divides before it sends): DDP then divides no more. */
static int dt__compress_averaged(const dt__compress *d) { return d->kind == DT_DDP_FP16; }

/* TOPK's k for a slice of cnt elements. */
static int64_t dt__compress_topk_k(const dt__compress *d, int64_t cnt) {
    int64_t k = (int64_t)ceil(d->topk_ratio * (double)cnt);
    return k < 1 ? 1 : k > cnt ? cnt : k;
}

/* TOPK: residual + slice, its top k as pairs in an all-gather with the counts after them (a rank without
   data sends k zeros and keeps its residual), the rest kept as the residual; then everyone's pairs summed
   into the zeroed slice in rank order. wire: [k indices][k values' bits][samples' bits][active]. */
static dt_result dt__compress_topk(dt__compress *d, int i, float *g, int64_t off, int64_t cnt) {
    int64_t k = dt__compress_topk_k(d, cnt), w = 2 * k + 2, j;
    int p = dt_comm_size(d->comm), q;
    float *res = d->residual ? d->residual + off : NULL, v, total = 0.0f, nactive = 0.0f;
    dt_result r;
    if (d->active) {
        if (res) for (j = 0; j < cnt; j++) g[j] += res[j];
        dt_topk_split(g, cnt, k, d->sel_idx, d->sel_val);
        if (res) memcpy(res, g, sizeof(float) * (size_t)cnt);
    } else {
        memset(d->sel_idx, 0, sizeof(int32_t) * (size_t)k);
        memset(d->sel_val, 0, sizeof(float) * (size_t)k);
    }
    v = d->active ? (float)d->acc_samples : 0.0f;
    memcpy(d->wire, d->sel_idx, sizeof(int32_t) * (size_t)k);
    memcpy(d->wire + k, d->sel_val, sizeof(float) * (size_t)k);
    memcpy(d->wire + 2 * k, &v, sizeof v);
    d->wire[2 * k + 1] = d->active;
    if ((r = dt_comm_allgather(d->comm, d->wire, d->gathered_wire, (size_t)w, DT_I32)) != DT_OK) return r;
    memset(g, 0, sizeof(float) * (size_t)cnt);
    for (q = 0; q < p; q++) {
        const int32_t *pw = d->gathered_wire + (int64_t)q * w;
        for (j = 0; j < k; j++) {
            if (pw[j] < 0 || pw[j] >= cnt)   /* a corrupt message must not write outside the slice */
                return dt_set_error(DT_ERR_COMM, "DDP sync (top-k): rank %d: rank %d sent element %ld of a slice of %lld: a corrupt "
                                    "message", dt_comm_rank(d->comm), q, (long)pw[j], (long long)cnt);
            memcpy(&v, pw + k + j, sizeof v);
            g[pw[j]] += v;
        }
        memcpy(&v, pw + 2 * k, sizeof v);
        total += v;
        nactive += (float)pw[2 * k + 1];
    }
    return i == 0 ? d->counts(d->user, total, nactive) : DT_OK;
}

/* POWERSGD: tensor t (in d->toff's order) is a matrix [rows, cols] to compress when rank r saves bytes:
   (rows + cols) r < rows cols; its Q [cols, r] starts at d->qoff[t] in d->psq. */
static int dt__psgd_matrix(const dt__compress *d, int t) { return d->mrows[t] > 0; }

/* P [rows, r]: its columns made orthonormal in order (Gram-Schmidt, sums in double: the same bits on
   every rank, which all hold the same summed P). A column that vanishes stays zero; a norm that is not finite
   (a rank sent a NaN or infinity) is DT_ERR_NUMERIC on every rank (dt__reduced_check). */
static dt_result dt__psgd_orthonormalize(const dt_comm *comm, float *P, int64_t rows, int r) {
    int c, j;
    int64_t i;
    dt_result e;
    for (c = 0; c < r; c++) {
        double norm = 0.0;
        for (j = 0; j < c; j++) {
            double dot = 0.0;
            for (i = 0; i < rows; i++) dot += (double)P[i * r + c] * (double)P[i * r + j];
            for (i = 0; i < rows; i++) P[i * r + c] -= (float)dot * P[i * r + j];
        }
        for (i = 0; i < rows; i++) norm += (double)P[i * r + c] * (double)P[i * r + c];
        if ((e = dt__reduced_check(comm, "DDP sync (PowerSGD)", "the squared norm of a column of the summed P", norm, 0.0, DBL_MAX)) != DT_OK)
            return e;
        if (norm > 0.0)
            for (i = 0; i < rows; i++) P[i * r + c] = (float)((double)P[i * r + c] / sqrt(norm));
    }
    return DT_OK;
}

/* The tensors of slice [off, off + cnt): their positions in d->toff's order, first..last. */
static void dt__psgd_tensors(const dt__compress *d, int64_t off, int64_t cnt, int *first, int *last) {
    int t;
    *first = d->ntensors;
    *last = -1;
    for (t = 0; t < d->ntensors; t++)
        if (d->toff[t] >= off && d->toff[t] < off + cnt) {
            if (t < *first) *first = t;
            *last = t;
        }
}

/* POWERSGD (Vogels et al. 2019), one power iteration per step with Q warm-started from the last:
   M = slice + residual for each matrix tensor; P = M Q summed over the ranks (with the vectors, sent as
   they are, and the first collective's counts in the same all-reduce), orthonormalized; Q = M^T P summed;
   the slice becomes P Q^T (the sum of the ranks' projections), the residual M - P Q^T / p. */
static dt_result dt__compress_powersgd(dt__compress *d, int i, float *grads, int64_t off, int64_t cnt) {
    int r = d->powersgd_rank, p = dt_comm_size(d->comm), t, first, last, c;
    int fb = d->residual != NULL && !d->no_feedback && d->active;
    float *buf = d->psbuf, *q0;
    int64_t pos = 0, a, b, nq = 0;
    dt_result rr;
    dt__psgd_tensors(d, off, cnt, &first, &last);
    for (t = first; t <= last; t++) {   /* P = M Q, or the vector as it is */
        float *M = grads + d->toff[t];
        if (!dt__psgd_matrix(d, t)) {
            memcpy(buf + pos, M, sizeof(float) * (size_t)d->tcnt[t]);
            pos += d->tcnt[t];
            continue;
        }
        if (fb) for (a = 0; a < d->tcnt[t]; a++) M[a] += d->residual[d->toff[t] + a];
        for (a = 0; a < d->mrows[t]; a++)
            for (c = 0; c < r; c++) {
                float s = 0.0f;
                for (b = 0; b < d->mcols[t]; b++) s += M[a * d->mcols[t] + b] * d->psq[d->qoff[t] + b * r + c];
                buf[pos + a * r + c] = s;
            }
        pos += d->mrows[t] * r;
        nq += d->mcols[t] * r;
    }
    if (i == 0) { buf[pos] = d->active ? (float)d->acc_samples : 0.0f; buf[pos + 1] = (float)d->active; }
    if ((rr = dt_comm_allreduce(d->comm, buf, (size_t)(pos + (i == 0 ? 2 : 0)), DT_F32, DT_SUM, d->algo)) != DT_OK) return rr;
    if (i == 0 && (rr = d->counts(d->user, buf[pos], buf[pos + 1])) != DT_OK) return rr;
    for (t = first, pos = 0; t <= last; t++) {   /* Q = M^T P with P orthonormal; vectors: their sum */
        float *M = grads + d->toff[t], *P = buf + pos, *Q = d->psq + d->qoff[t];
        if (!dt__psgd_matrix(d, t)) {
            memcpy(M, buf + pos, sizeof(float) * (size_t)d->tcnt[t]);
            pos += d->tcnt[t];
            continue;
        }
        if ((rr = dt__psgd_orthonormalize(d->comm, P, d->mrows[t], r)) != DT_OK) return rr;
        for (b = 0; b < d->mcols[t] * r; b++) Q[b] = 0.0f;
        for (a = 0; a < d->mrows[t]; a++)
            for (b = 0; b < d->mcols[t]; b++)
                for (c = 0; c < r; c++) Q[b * r + c] += M[a * d->mcols[t] + b] * P[a * r + c];
        pos += d->mrows[t] * r;
    }
    if (nq == 0) return DT_OK;
    q0 = d->psq + d->qoff[first];   /* the slice's Qs are consecutive (a vector's qoff is the next matrix's) */
    if ((rr = dt_comm_allreduce(d->comm, q0, (size_t)nq, DT_F32, DT_SUM, d->algo)) != DT_OK) return rr;
    for (t = first, pos = 0; t <= last; t++) {   /* the slice: P Q^T; the residual: what this rank's M kept */
        float *M = grads + d->toff[t], *P = buf + pos, *Q = d->psq + d->qoff[t];
        if (!dt__psgd_matrix(d, t)) { pos += d->tcnt[t]; continue; }
        for (a = 0; a < d->mrows[t]; a++)
            for (b = 0; b < d->mcols[t]; b++) {
                float s = 0.0f;
                for (c = 0; c < r; c++) s += P[a * r + c] * Q[b * r + c];
                if (fb) d->residual[d->toff[t] + a * d->mcols[t] + b] = M[a * d->mcols[t] + b] - s / (float)p;
                M[a * d->mcols[t] + b] = s;
            }
        pos += d->mrows[t] * r;
    }
    return DT_OK;
}

/* POWERSGD's plan: which tensors are matrices, where their Qs go, the largest slice's all-reduce; the
   residual (zeros) and the Qs (seeded, the same on every rank) in one block. */
static dt_result dt__psgd_alloc(dt__compress *d, int nslices, const int64_t *soff, const int64_t *scnt) {
    int nt = d->ntensors, r = d->powersgd_rank, t, i, first, last;
    int64_t q = 0, most = 0, j;
    dt_rng g;
    d->mrows = (int64_t *)DT_MALLOC(sizeof(int64_t) * (size_t)(nt + 1));
    d->mcols = (int64_t *)DT_MALLOC(sizeof(int64_t) * (size_t)(nt + 1));
    d->qoff = (int64_t *)DT_MALLOC(sizeof(int64_t) * (size_t)(nt + 1));
    if (!d->mrows || !d->mcols || !d->qoff) return DT_ERR_OUT_OF_MEMORY;
    for (t = 0; t < nt; t++) {
        dt_param_info pi = dt_model_param_info(d->model, nt - 1 - t);
        int64_t rows = pi.ndim >= 2 ? pi.shape[0] : 0, cols = rows > 0 ? pi.count / rows : 0;
        int mat = rows > 0 && (rows + cols) * r < rows * cols;
        d->mrows[t] = mat ? rows : 0;
        d->mcols[t] = mat ? cols : 0;
        d->qoff[t] = q;
        q += mat ? cols * r : 0;
    }
    d->qoff[nt] = q;
    for (i = 0; i < nslices; i++) {   /* the slice's Ps and vectors */
        int64_t w = 2;
        dt__psgd_tensors(d, soff[i], scnt[i], &first, &last);
        for (t = first; t <= last; t++) w += d->mrows[t] ? d->mrows[t] * r : d->tcnt[t];
        most = w > most ? w : most;
    }
    d->nstate = d->n + q;
    d->psbuf = (float *)DT_MALLOC(sizeof(float) * (size_t)most);
    if (!d->psbuf || !(d->residual = (float *)DT_MALLOC(sizeof(float) * (size_t)(d->nstate + 1)))) return DT_ERR_OUT_OF_MEMORY;
    memset(d->residual, 0, sizeof(float) * (size_t)d->n);
    d->psq = d->residual + d->n;
    dt_rng_init(&g, 0x9057cdULL, 0);
    for (j = 0; j < q; j++) d->psq[j] = (float)dt_rng_u32(&g) / 4294967296.0f * 2.0f - 1.0f;
    return DT_OK;
}

/* The compressor's buffers for a sync of nslices slices [soff[i], soff[i] + scnt[i]) of the gradient, sized for
   the largest; the residual starts at zero. Fill in the settings and DDP's plan first (see dt__compress). */
static dt_result dt__compress_alloc(dt__compress *d, int nslices, const int64_t *soff, const int64_t *scnt) {
    int64_t most = 0, k;
    int i, p = dt_comm_size(d->comm);
    for (i = 0; i < nslices; i++) most = scnt[i] > most ? scnt[i] : most;
    if (d->kind == DT_DDP_BF16 || d->kind == DT_DDP_FP16)
        return (d->half = (uint16_t *)DT_MALLOC(sizeof(uint16_t) * (size_t)(most + 1))) ? DT_OK : DT_ERR_OUT_OF_MEMORY;
    if (d->kind == DT_DDP_POWERSGD) return dt__psgd_alloc(d, nslices, soff, scnt);
    if (d->kind != DT_DDP_TOPK) return DT_OK;
    d->nstate = d->no_feedback ? 0 : d->n;
    k = dt__compress_topk_k(d, most);
    d->sel_idx = (int32_t *)DT_MALLOC(sizeof(int32_t) * (size_t)k);
    d->sel_val = (float *)DT_MALLOC(sizeof(float) * (size_t)k);
    d->wire = (int32_t *)DT_MALLOC(sizeof(int32_t) * (size_t)(2 * k + 2));
    d->gathered_wire = (int32_t *)DT_MALLOC(sizeof(int32_t) * (size_t)p * (size_t)(2 * k + 2));
    if (!d->no_feedback && (d->residual = (float *)DT_MALLOC(sizeof(float) * (size_t)(d->n + 1))) != NULL)
        memset(d->residual, 0, sizeof(float) * (size_t)(d->n + 1));
    return d->sel_idx && d->sel_val && d->wire && d->gathered_wire && (d->no_feedback || d->residual) ? DT_OK : DT_ERR_OUT_OF_MEMORY;
}

/* Slice [off, off + cnt) of grads, weighted by this rank, summed over the ranks in compressed form (i: which
   collective of the sync, 0 the first; active and samples: this rank's part in it). */
static dt_result dt__compress_slice(dt__compress *d, int i, float *grads, int64_t off, int64_t cnt, int active,
                                    int64_t samples) {
    d->active = active;
    d->acc_samples = samples;
    if (d->kind == DT_DDP_TOPK) return dt__compress_topk(d, i, grads + off, off, cnt);
    if (d->kind == DT_DDP_POWERSGD) return dt__compress_powersgd(d, i, grads, off, cnt);
    return dt__compress_half(d, i, grads + off, cnt);
}

static void dt__compress_free(dt__compress *d) {
    DT_FREE(d->half); DT_FREE(d->residual); DT_FREE(d->sel_idx); DT_FREE(d->sel_val); DT_FREE(d->wire);
    DT_FREE(d->gathered_wire); DT_FREE(d->mrows); DT_FREE(d->mcols); DT_FREE(d->qoff); DT_FREE(d->psbuf);
}

#ifdef __cplusplus
}
#endif
#endif /* the implementation */
