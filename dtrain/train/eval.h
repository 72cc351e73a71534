/* dtrain/train/eval.h - evaluation: loss and accuracy of a classifier over a data set.
   Part of dtrain v0.1.0, MIT license (see the end of dtrain.h, which is the manual and the one include).

   WHAT IS HERE
     dt_evaluate: a model in eval mode over samples of a data set (a dt_eval_desc), batch by batch (top-1,
     top-k, mean loss); dt_evaluate_comm: the same with the batches shared among the ranks of a communicator.
   USES
     dtrain/core/nn.h, dtrain/core/data.h and dtrain/comm/comm.h, and what they include.
*/
#ifndef DTRAIN_EVAL_H
#define DTRAIN_EVAL_H
#include "../core/nn.h"
#include "../core/data.h"
#include "../comm/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What dt_evaluate measures. Zero means the default. */
typedef struct dt_eval_desc {
    const dt_dataset   *dataset;     /* the samples (no default) */
    const int64_t      *indices;     /* [count] sample ids; NULL (and count 0) = all samples of the dataset */
    int64_t             count;
    const dt_transform *transform;   /* NULL = pixel / 255 */
    int64_t             batch;       /* samples per forward pass (default 1000) */
    int                 topk;        /* also count labels among the k highest scores (default 1; at most the classes) */
} dt_eval_desc;

/* The result: the mean loss and the accuracies over the samples. */
typedef struct dt_eval_result {
    double  loss;            /* mean over the samples */
    double  top1, topk;      /* fractions in [0, 1] */
    int64_t count;
    int     k;               /* the k of topk */
} dt_eval_result;

/* Loss and accuracy of a classifier over the samples d names, in eval mode (the mode is restored after).
   The loss is NLL when the model ends in dt_log_softmax, cross-entropy otherwise. */
dt_result dt_evaluate(dt_model *m, const dt_eval_desc *d, dt_eval_result *out);
/* The same, collective over c, for ranks that hold the same model (DDP's replicas; D-PSGD's or local SGD's
   after an average): the batches are dealt round-robin (batch b to rank b mod size), and their sums come back
   in batch order, so every rank gets dt_evaluate's result to the last bit, in about 1/size of its time, and
   no rank waits for another's whole evaluation (a short communicator timeout then still holds). A rank that
   fails its part fails with its own error; the others return DT_ERR_PEER naming it. */
dt_result dt_evaluate_comm(dt_comm *c, dt_model *m, const dt_eval_desc *d, dt_eval_result *out);

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_EVAL_H */

#if defined(DTRAIN_IMPLEMENTATION) && !defined(DTRAIN_EVAL_IMPLEMENTATION_DONE)
#define DTRAIN_EVAL_IMPLEMENTATION_DONE

#ifdef __cplusplus
extern "C" {
#endif
#include "../core/internal.h"


/* Samples per forward pass of dt_evaluate by default. */
#define DT__EVAL_BATCH 1000

/* The batches b = rank, rank + size, ... of what d names: sums[3 b + 0..2] = the batch's loss x samples, top-1
   hits and top-k hits (the rest stays as it was); *count and *k: the samples and the k of top-k. */
static dt_result dt__evaluate_part(dt_model *m, const dt_eval_desc *d, int rank, int size, double *sums, int64_t *count_out,
                                   int *k_out, int64_t *nbatches, int plan) {
    dt_result r = DT_OK;
    const dt_dataset *ds;
    const int64_t *idx;
    dt_batch_desc b;
    int64_t start, k, in_size, i, j, count, batch, nb;
    int topk;
    dt_mode mode;
    float *x = NULL, *scores = NULL;
    int32_t *y = NULL;
    int64_t *ids = NULL;
    const dt_ops *ops;
    void *ctx;
    if ((r = dt__need_final(m, "dt_evaluate")) != DT_OK) return r;
    ops = dt__model_ops(m, &ctx);
    ds = d->dataset; idx = d->indices; count = d->count; topk = d->topk;
    batch = d->batch ? d->batch : DT__EVAL_BATCH;
    if (!ds) return dt_set_error(DT_ERR_INVALID_ARG, "dt_evaluate: dataset is NULL; set it to the samples to evaluate on");
    if (!idx && count != 0)
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_evaluate: count is %lld but indices is NULL; pass the sample ids, or "
                            "leave count 0 for all samples", (long long)count);
    if (!idx) count = ds->count;
    if (count <= 0)
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_evaluate: count is %lld; it must be > 0 (%s)", (long long)count,
                            idx ? "the number of indices" : "the dataset is empty");
    if (batch < 0)
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_evaluate: batch is %lld; it must be > 0, or 0 for the default %d",
                            (long long)batch, DT__EVAL_BATCH);
    if (topk < 0)
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_evaluate: topk is %d; it must be >= 1, or 0 for the default 1", topk);
    in_size = dt_model_node_size(m, 0);
    k = dt_model_node_size(m, dt_model_output_node(m));
    if (ds->c * ds->h * ds->w != in_size)
        return dt_set_error(DT_ERR_SHAPE, "dt_evaluate: samples of %s are %lldx%lldx%lld but the model takes %lld values",
                            ds->source[0] ? ds->source : "the dataset", (long long)ds->c, (long long)ds->h,
                            (long long)ds->w, (long long)in_size);
    if (topk < 1) topk = 1;
    if (topk > k) topk = (int)k;
    if (batch > count) batch = count;
    nb = (count + batch - 1) / batch;
    *count_out = count; *k_out = topk; *nbatches = nb;
    if (plan) return DT_OK;   /* the checks and the batches only */
    x = (float *)DT_MALLOC(sizeof(float) * (size_t)(batch * in_size));
    scores = (float *)DT_MALLOC(sizeof(float) * (size_t)(batch * k));
    y = (int32_t *)DT_MALLOC(sizeof(int32_t) * (size_t)batch);
    ids = (int64_t *)DT_MALLOC(sizeof(int64_t) * (size_t)batch);
    if (!x || !scores || !y || !ids) {
        r = dt_set_error(DT_ERR_OUT_OF_MEMORY, "dt_evaluate: no memory for a batch of %lld", (long long)batch);
        goto done;
    }
    memset(&b, 0, sizeof b);   /* no random choices: seed and epoch 0 */
    b.indices = ids; b.transform = d->transform;
    mode = dt_model_mode(m);
    dt_model_set_mode(m, DT_MODE_EVAL);
    dt_trace_begin("evaluate", "compute");
    dt__trace_arg("samples", NULL, count);
    for (start = (int64_t)rank * batch; start < count && r == DT_OK; start += (int64_t)size * batch) {
        int64_t n = count - start < batch ? count - start : batch, hits1 = 0, hitsk = 0;
        double *s = sums + 3 * (start / batch);
        float loss = 0.0f;
        for (i = 0; i < n; i++) ids[i] = idx ? idx[start + i] : start + i;
        b.count = n;
        if ((r = dt_dataset_batch(ds, &b, x, y)) != DT_OK) break;
        if ((r = dt_model_forward(m, x, n)) != DT_OK) break;
        r = dt_model_loss_labels(m, y, &loss);
        if (r != DT_OK && r != DT_ERR_NUMERIC) break;
        r = DT_OK;                                /* a NaN loss is reported as such in the result */
        ops->download(ctx, scores, dt_model_node_output(m, dt_model_output_node(m)), (int64_t)sizeof(float) * n * k);
        for (i = 0; i < n; i++) {
            const float *row = scores + i * k;
            int64_t above = 0;                    /* classes scoring strictly higher than the label, or equal and earlier */
            for (j = 0; j < k; j++)
                above += row[j] > row[y[i]] || (row[j] == row[y[i]] && j < y[i]) || row[j] != row[j];   /* NaN: wrong */
            hits1 += above == 0;
            hitsk += above < topk;
        }
        s[0] = (double)loss * (double)n;
        s[1] = (double)hits1;
        s[2] = (double)hitsk;
    }
    dt_trace_end();
    dt_model_set_mode(m, mode);   /* cannot fail: m and mode are valid */
done:
    DT_FREE(x); DT_FREE(scores); DT_FREE(y); DT_FREE(ids);
    return r;
}

/* The result from the batches' sums, added in batch order (the same bits however the batches were shared). */
static void dt__evaluate_sum(const double *sums, int64_t nb, int64_t count, int k, dt_eval_result *out) {
    double loss_sum = 0.0, top1 = 0.0, topk = 0.0;
    int64_t i;
    for (i = 0; i < nb; i++) {
        loss_sum += sums[3 * i];
        top1 += sums[3 * i + 1];
        topk += sums[3 * i + 2];
    }
    out->count = count;
    out->loss = loss_sum / (double)count;
    out->top1 = top1 / (double)count;
    out->topk = topk / (double)count;
    out->k = k;
}

/* Both: the plan (the checks; the batches), the sums of this rank's batches, and with c the sums of all ranks'
   and of their failures (one all-reduce of 3 nb + 1 doubles: each batch's sums are non-zero on one rank only,
   so the sum is exact). */
static dt_result dt__evaluate(dt_comm *c, dt_model *m, const dt_eval_desc *d, dt_eval_result *out) {
    int64_t count = 0, nb = 0;
    int k = 1, me = c ? dt_comm_rank(c) : 0, p = c ? dt_comm_size(c) : 1;
    double *sums;
    dt_result r, rc;
    const char *fn = c ? "dt_evaluate_comm" : "dt_evaluate";
    if (!d || !out) return dt_set_error(DT_ERR_INVALID_ARG, "%s: the desc or the result is NULL", fn);
    memset(out, 0, sizeof *out);
    if ((r = dt__evaluate_part(m, d, me, p, NULL, &count, &k, &nb, 1)) != DT_OK && !c) return r;
    sums = (double *)DT_MALLOC(sizeof(double) * (size_t)(3 * nb + 1));
    if (sums) memset(sums, 0, sizeof(double) * (size_t)(3 * nb + 1));
    else {
        r = dt_set_error(DT_ERR_OUT_OF_MEMORY, "%s: no memory for the sums of %lld batches", fn, (long long)nb);
        if (!c) return r;
    }
    if (r == DT_OK) r = dt__evaluate_part(m, d, me, p, sums, &count, &k, &nb, 0);
    if (c) {   /* every rank takes part, a failed one with its failure counted, so that none waits for it */
        double failed = r != DT_OK;
        if (sums) sums[3 * nb] = failed;
        if ((rc = dt_comm_allreduce(c, sums ? sums : &failed, sums ? (size_t)(3 * nb + 1) : 1, DT_F64, DT_SUM, DT_ALGO_AUTO)) != DT_OK &&
            r == DT_OK)
            r = rc;
        if (r == DT_OK && sums[3 * nb] != 0.0)
            r = dt_set_error(DT_ERR_PEER, "dt_evaluate_comm: rank %d: %.0f other rank(s) failed their part of the evaluation: see "
                             "their reports", me, sums[3 * nb]);
    }
    if (r == DT_OK) dt__evaluate_sum(sums, nb, count, k, out);
    DT_FREE(sums);
    return r;
}

dt_result dt_evaluate(dt_model *m, const dt_eval_desc *d, dt_eval_result *out) { return dt__evaluate(NULL, m, d, out); }

dt_result dt_evaluate_comm(dt_comm *c, dt_model *m, const dt_eval_desc *d, dt_eval_result *out) {
    if (!c) return dt_set_error(DT_ERR_INVALID_ARG, "dt_evaluate_comm: the communicator is NULL");
    return dt__evaluate(c, m, d, out);
}

#ifdef __cplusplus
}
#endif
#endif /* the implementation */
