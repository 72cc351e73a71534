/* dtrain/train/eval.h - evaluation: loss and accuracy of a classifier over a data set.
   Part of dtrain v0.1.0, MIT license (see the end of dtrain.h, which is the manual and the one include).

   WHAT IS HERE
     dt_evaluate: a model in eval mode over samples of a data set (a dt_eval_desc), batch by batch (top-1,
     top-k, mean loss).
   USES
     dtrain/core/nn.h and dtrain/core/data.h, and what they include.
*/
#ifndef DTRAIN_EVAL_H
#define DTRAIN_EVAL_H
#include "../core/nn.h"
#include "../core/data.h"

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

dt_result dt_evaluate(dt_model *m, const dt_eval_desc *d, dt_eval_result *out) {
    dt_result r = DT_OK;
    const dt_dataset *ds;
    const int64_t *idx;
    dt_batch_desc b;
    int64_t start, k, in_size, i, j, top1 = 0, topk_hits = 0, count, batch;
    int topk;
    dt_mode mode;
    double loss_sum = 0.0;
    float *x = NULL, *scores = NULL;
    int32_t *y = NULL;
    int64_t *ids = NULL;
    const dt_ops *ops;
    void *ctx;
    if ((r = dt__need_final(m, "dt_evaluate")) != DT_OK) return r;
    ops = dt__model_ops(m, &ctx);
    if (!d || !out) return dt_set_error(DT_ERR_INVALID_ARG, "dt_evaluate: the desc or the result is NULL");
    memset(out, 0, sizeof *out);
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
    for (start = 0; start < count && r == DT_OK; start += batch) {
        int64_t n = count - start < batch ? count - start : batch;
        float loss = 0.0f;
        for (i = 0; i < n; i++) ids[i] = idx ? idx[start + i] : start + i;
        b.count = n;
        if ((r = dt_dataset_batch(ds, &b, x, y)) != DT_OK) break;
        if ((r = dt_model_forward(m, x, n)) != DT_OK) break;
        r = dt_model_loss_labels(m, y, &loss);
        if (r != DT_OK && r != DT_ERR_NUMERIC) break;
        r = DT_OK;                                /* a NaN loss is reported as such in the result */
        loss_sum += (double)loss * (double)n;
        ops->download(ctx, scores, dt_model_node_output(m, dt_model_output_node(m)), (int64_t)sizeof(float) * n * k);
        for (i = 0; i < n; i++) {
            const float *row = scores + i * k;
            int64_t above = 0;                    /* classes scoring strictly higher than the label, or equal and earlier */
            for (j = 0; j < k; j++)
                above += row[j] > row[y[i]] || (row[j] == row[y[i]] && j < y[i]) || row[j] != row[j];   /* NaN: wrong */
            top1 += above == 0;
            topk_hits += above < topk;
        }
    }
    dt_trace_end();
    dt_model_set_mode(m, mode);   /* cannot fail: m and mode are valid */
    if (r == DT_OK) {
        out->count = count;
        out->loss = loss_sum / (double)count;
        out->top1 = (double)top1 / (double)count;
        out->topk = (double)topk_hits / (double)count;
        out->k = topk;
    }
done:
    DT_FREE(x); DT_FREE(scores); DT_FREE(y); DT_FREE(ids);
    return r;
}

#ifdef __cplusplus
}
#endif
#endif /* the implementation */
