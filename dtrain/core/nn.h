/* dtrain/core/nn.h - models: a graph of layers over flat parameter buffers, and losses.   Part of
   dtrain v0.1.0, MIT license (see the end of dtrain.h, which is the manual and the one include).

   WHAT IS HERE
     The model's whole API (its passes' bodies are in dtrain/core/pass.h), and the bodies of: the builder
     (dt_model_create, dt_conv2d, dt_relu, dt_add, ...: each call adds a node), finalize (every parameter a
     view into ONE flat buffer, gradients in a twin buffer, batch norm's statistics in a third), and the flat
     buffers' accessors and views. The model's graph, struct dt_model, is in dtrain/core/internal.h, the view
     nn.h and pass.h share. The zoo's models are built in dtrain/core/zoo.h.
   USES
     dtrain/cpu/cpu.h (the default backend) and what it includes. Another default backend is registered,
     not named: dtrain.h defines DT__DEFAULT_BACKEND (the GPU's, with DT_USE_CUDA).
   READ FIRST
     struct dt_model (dtrain/core/internal.h), dt_model_finalize (the flat buffers), then dtrain/core/pass.h.
*/
#ifndef DTRAIN_NN_H
#define DTRAIN_NN_H
#include "../cpu/cpu.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dt_layer_kind {
    DT_LAYER_INPUT = 0, DT_LAYER_LINEAR, DT_LAYER_CONV2D, DT_LAYER_MAXPOOL2D, DT_LAYER_AVGPOOL2D,
    DT_LAYER_GLOBAL_AVGPOOL, DT_LAYER_RELU, DT_LAYER_DROPOUT, DT_LAYER_BATCHNORM, DT_LAYER_FLATTEN,
    DT_LAYER_ADD, DT_LAYER_PAD_SHORTCUT, DT_LAYER_LOG_SOFTMAX, DT_LAYER_KIND_COUNT
} dt_layer_kind;

/* Name of a layer kind, e.g. "conv2d". */
const char *dt_layer_kind_str(dt_layer_kind k);

/* The arithmetic of a model's convolutions and linear layers. FP32: every operand and sum in float. BF16: mixed
   precision, PyTorch's CPU autocast rules: the convolutions' and linear layers' operands (activations, weights,
   output gradients) rounded to bfloat16 (nearest, ties to even, as dt_bf16_from_float), their products summed in
   float; master weights, gradients, optimizer state, biases, batch norm (its statistics too) and losses in float.
   The same roundings on every CPU tier: AVX-512 with AVX512_BF16 multiplies the bf16 pairs (vdpbf16ps), the
   others multiply the rounded values in float, so a tier changes only the order of the sums. */
typedef enum dt_precision { DT_PRECISION_FP32 = 0, DT_PRECISION_BF16, DT_PRECISION_COUNT } dt_precision;
const char *dt_precision_name(dt_precision p);                      /* "fp32", "bf16" */
dt_result   dt_precision_parse(const char *name, dt_precision *out); /* DT_ERR_INVALID_ARG naming fp32 and bf16 */

/* Model configuration; zero means the default. */
typedef struct dt_model_desc {
    int64_t       in_c, in_h, in_w;   /* per-sample input shape; in_h = in_w = 0 for a vector of in_c */
    uint64_t      seed;               /* weight initialisation and dropout masks (default 0) */
    uint64_t      stream;             /* RNG stream, e.g. the rank (default 0) */
    const dt_ops *ops;                /* backend (default dt_cpu_ops(); dt_cuda_ops() in a DT_USE_CUDA build) */
    void         *ops_ctx;            /* backend state passed to every op (the GPU's: a dt_cuda, or NULL for one
                                         the model creates and destroys) */
    int           input_grad;         /* 1: also compute the gradient w.r.t. the input (dt_model_node_grad(m, 0)) */
    dt_precision  precision;          /* DT_PRECISION_FP32 (default) or DT_PRECISION_BF16 (the CPU backend only) */
} dt_model_desc;

typedef struct dt_model dt_model;

/* A named view into a flat buffer: parameters (trainable) or buffers (running statistics). */
typedef struct dt_param_info {
    const char *name;                 /* e.g. "conv1.weight", "layers.0.bn1.running_mean" */
    int         node;                 /* node that owns it */
    int64_t     offset, count;        /* elements, into dt_model_params() or dt_model_buffers() */
    int         ndim;
    int64_t     shape[DT_MAX_DIMS];
} dt_param_info;

/* Creates an empty model holding only its input node. *out is NULL on failure. */
dt_result dt_model_create(dt_model **out, const dt_model_desc *desc);
/* Frees everything the model allocated. NULL is allowed. */
void dt_model_destroy(dt_model *m);

/* Builder: each call adds one node and returns its id (or -1 after an error, kept for finalize).
   Shapes are checked here, so a bad network fails where it is written. */
int dt_model_input(dt_model *m);                                                /* id of the input node */
int dt_linear(dt_model *m, int x, int64_t out_features, int bias);              /* x: [in] -> [out] */
/* A window: kernel x kernel with stride and pad on both axes; or, with kernel 0, kernel_h x kernel_w with
   stride_h, stride_w, pad_h, pad_w (a 1 x 3 or 3 x 1 kernel; a 1-D convolution as 1 x k on [c, 1, w]).
   Stride 0 is the default: 1 for a convolution, the kernel's size for pooling. */
typedef struct dt_conv2d_desc {
    int64_t out_channels;
    int64_t kernel, stride, pad;     /* square window (stride 0 = 1) */
    int     no_bias;                 /* 1 = no bias (before a batchnorm) */
    int64_t kernel_h, kernel_w;      /* with kernel 0: a kernel_h x kernel_w window, */
    int64_t stride_h, stride_w;      /* its strides (0 = 1) */
    int64_t pad_h, pad_w;            /* and the zero padding of each axis */
} dt_conv2d_desc;
int dt_conv2d(dt_model *m, int x, int64_t out_channels, int64_t kernel, int64_t stride, int64_t pad);
int dt_conv2d_ex(dt_model *m, int x, const dt_conv2d_desc *d);
typedef struct dt_pool2d_desc {
    int64_t kernel, stride, pad;     /* square window (stride 0 = kernel) */
    int64_t kernel_h, kernel_w;      /* with kernel 0: a kernel_h x kernel_w window, */
    int64_t stride_h, stride_w;      /* its strides (0 = the kernel's size on that axis) */
    int64_t pad_h, pad_w;            /* and the padding of each axis (at most half the kernel there) */
} dt_pool2d_desc;
int dt_maxpool2d(dt_model *m, int x, int64_t kernel, int64_t stride, int64_t pad); /* stride 0 = kernel */
int dt_avgpool2d(dt_model *m, int x, int64_t kernel, int64_t stride, int64_t pad); /* zero padding counted */
int dt_maxpool2d_ex(dt_model *m, int x, const dt_pool2d_desc *d);
int dt_avgpool2d_ex(dt_model *m, int x, const dt_pool2d_desc *d);
int dt_global_avgpool(dt_model *m, int x);                                      /* [c,h,w] -> [c] */
int dt_relu(dt_model *m, int x);
int dt_dropout(dt_model *m, int x, float p);                                    /* 0 <= p < 1 */
int dt_batchnorm(dt_model *m, int x);                                           /* 2-D for [c,h,w], 1-D for [c] */
int dt_batchnorm_ex(dt_model *m, int x, float eps, float momentum);             /* defaults 1e-5, 0.1 */
int dt_flatten(dt_model *m, int x);                                             /* [c,h,w] -> [c*h*w], no copy */
int dt_add(dt_model *m, int a, int b);                                          /* residual sum, same shapes */
int dt_pad_shortcut(dt_model *m, int x, int64_t out_channels, int64_t stride);  /* ResNet option A */
int dt_log_softmax(dt_model *m, int x);                                         /* over [k] */
/* Names node x (the name is copied: 1 to 60 characters); its parameters become "<name>.weight" etc. Returns x, or
   -1 after an error, kept for finalize like the layers' (dt_model_node_name reads the name back). */
int dt_model_set_node_name(dt_model *m, int x, const char *name);

/* Plans and allocates the flat buffers and initialises weights as PyTorch does by default
   (kaiming-uniform a=sqrt(5) for conv/linear weights, uniform(+-1/sqrt(fan_in)) biases, batchnorm 1/0).
   Returns the first builder error, if any. The last node added is the model's output. */
dt_result dt_model_finalize(dt_model *m);

/* The model's mode: DT_MODE_TRAIN (the default: dropout active, batchnorm on batch statistics) or
   DT_MODE_EVAL (no dropout, batchnorm on its running statistics). */
typedef enum dt_mode { DT_MODE_TRAIN = 0, DT_MODE_EVAL } dt_mode;
/* Sets the mode; another value than DT_MODE_TRAIN or DT_MODE_EVAL is DT_ERR_INVALID_ARG and the mode stays. */
dt_result dt_model_set_mode(dt_model *m, dt_mode mode);
dt_mode   dt_model_mode(const dt_model *m);   /* DT_MODE_TRAIN for NULL */

/* Forward pass on a host batch x [batch, in_c, in_h, in_w]. Grows the activation arena the first
   time a larger batch is seen. In training mode a batch norm with one value per channel (batch 1 of a
   vector or of 1 x 1 maps) is refused (DT_ERR_SHAPE), as in PyTorch. */
dt_result dt_model_forward(dt_model *m, const float *x, int64_t batch);
/* Losses on the output node of the last forward, mean over the batch. They return the loss in *loss and
   set the output's gradient for dt_model_backward. labels: host int32 [batch] in [0, k). */
dt_result dt_model_loss_cross_entropy(dt_model *m, const int32_t *labels, float *loss); /* softmax + NLL */
dt_result dt_model_loss_nll(dt_model *m, const int32_t *labels, float *loss);           /* on log-probs */
dt_result dt_model_loss_mse(dt_model *m, const float *target, float *loss);             /* target host [batch, k] */
/* The classification loss that fits the model: NLL when it ends in dt_log_softmax, cross-entropy otherwise. */
dt_result dt_model_loss_labels(dt_model *m, const int32_t *labels, float *loss);
/* Backward pass: gradients ACCUMULATE into dt_model_grads(). dy (host, shape of the output) is the
   upstream gradient; NULL uses the gradient set by the last dt_model_loss_* call. */
dt_result dt_model_backward(dt_model *m, const float *dy);
/* Sets every parameter gradient to zero. */
void dt_model_zero_grad(dt_model *m);
/* A function dt_model_backward calls right after each node's backward (node = nnodes - 1 down to 1): from
   then on the gradients of the parameters of nodes >= node are final for this pass (parameters are laid
   out in node order, so that is every gradient from some offset to the end of the flat buffer). It runs on
   the caller's thread, between two nodes. dt_ddp uses it to start reducing a bucket of gradients while
   backward goes on. fn NULL removes it; one hook per model. */
typedef void (*dt_backward_hook)(void *user, dt_model *m, int node);
void dt_model_set_backward_hook(dt_model *m, dt_backward_hook fn, void *user);
/* Synchronised batch norm (PyTorch's SyncBatchNorm): in training mode each batch norm normalises with the
   statistics of the whole batch over the ranks, not of this rank's part, and backward passes the gradient
   through those statistics. fn sums n doubles in place over the ranks (every rank calls it in the same
   order and gets the same sums) and returns DT_OK or its failure, which the pass then returns; dt_ddp_desc's
   sync_bn installs one. Each batch norm calls it twice a step: in forward with the sums of x and x^2 per
   channel and its count of values (2c + 1 doubles), in backward with the sums of dy and dy x weighted by this
   rank's batch (2c; not where nothing needs the input's gradient). So with gradients weighted by samples (as
   dt_ddp weighs them) a step equals one process's over the whole batch, to rounding. The running statistics
   follow the whole batch's, the same on every rank. fn NULL turns it off. DT_ERR_STATE before
   dt_model_finalize; DT_ERR_UNSUPPORTED on a backend without dt_ops.bn_sums (the GPU's, today). */
typedef dt_result (*dt_bn_sync_fn)(void *user, double *buf, int64_t n);
dt_result dt_model_set_bn_sync(dt_model *m, dt_bn_sync_fn fn, void *user);
/* Copies the output of the last forward ([batch, out...]) to host memory; count = batch * output size. */
dt_result dt_model_get_output(dt_model *m, float *host, int64_t count);
/* Number of correctly classified samples of the last forward (argmax of the output vs labels). */
dt_result dt_model_count_correct(dt_model *m, const int32_t *labels, int64_t *correct);

/* Flat buffers (backend memory; host memory for the CPU backend). count may be NULL. */
float  *dt_model_params(dt_model *m, int64_t *count);
float  *dt_model_grads(dt_model *m, int64_t *count);
float  *dt_model_buffers(dt_model *m, int64_t *count);
int64_t dt_model_param_count(const dt_model *m);       /* trainable elements, as PyTorch counts them */
/* Copy all parameters (or buffers) from / to host memory; count must match exactly. */
dt_result dt_model_set_params(dt_model *m, const float *host, int64_t count);
dt_result dt_model_get_params(dt_model *m, float *host, int64_t count);
dt_result dt_model_get_grads(dt_model *m, float *host, int64_t count);
dt_result dt_model_set_buffers(dt_model *m, const float *host, int64_t count);
dt_result dt_model_get_buffers(dt_model *m, float *host, int64_t count);
/* Named listing: parameters in creation order, then buffers. */
int dt_model_param_tensors(const dt_model *m);
int dt_model_buffer_tensors(const dt_model *m);
dt_param_info dt_model_param_info(const dt_model *m, int i);
dt_param_info dt_model_buffer_info(const dt_model *m, int i);
/* Graph inspection. */
int         dt_model_nodes(const dt_model *m);
int         dt_model_output_node(const dt_model *m);
dt_layer_kind dt_model_node_kind(const dt_model *m, int node);
const char *dt_model_node_name(const dt_model *m, int node);
int64_t     dt_model_node_size(const dt_model *m, int node);          /* per-sample element count */
int         dt_model_node_shape(const dt_model *m, int node, int64_t shape[3]); /* returns ndim (1 or 3) */
/* Read access to a node's activation or gradient of the last pass ([batch, size], backend memory). NULL
   for a batch norm or add whose only reader is a ReLU, when the backend runs the ReLU inside it (the CPU
   does): that output is never stored; the ReLU's is. */
const float *dt_model_node_output(const dt_model *m, int node);
const float *dt_model_node_grad(const dt_model *m, int node);
/* Writes a table of the layers, shapes and parameter counts (like torchsummary) with dt_log(INFO). */
void dt_model_summary(const dt_model *m);

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_NN_H */

#if defined(DTRAIN_IMPLEMENTATION) && !defined(DTRAIN_NN_IMPLEMENTATION_DONE)
#define DTRAIN_NN_IMPLEMENTATION_DONE

#ifdef __cplusplus
extern "C" {
#endif
#include "../cpu/kernel.h"   /* dt__cpu_state: the CPU backend's state, which a model holds */
#include "internal.h"        /* with the model's graph, struct dt_model (shared with dtrain/core/pass.h) */

const char *dt_layer_kind_str(dt_layer_kind k) {
    static const char *names[DT_LAYER_KIND_COUNT] = {"input", "linear", "conv2d", "maxpool2d", "avgpool2d",
        "global_avgpool", "relu", "dropout", "batchnorm", "flatten", "add", "pad_shortcut", "log_softmax"};
    return (k >= 0 && k < DT_LAYER_KIND_COUNT) ? names[k] : "unknown";
}

/* The default backend a build registered: dtrain.h, the composition root, defines DT__DEFAULT_BACKEND as the
   name of the function that returns it, which the backend's implementation defines (the GPU's, with
   DT_USE_CUDA). Without one, a model whose desc.ops is NULL runs on the CPU. */
#ifdef DT__DEFAULT_BACKEND
const dt_backend *DT__DEFAULT_BACKEND(void);
#endif

/* Waits for the backend's ops (dt_ops.sync) and returns their first failure, named after the call. */
static dt_result dt__sync(const dt_model *m, const char *what) {
    char msg[DT__ERROR_CAP];
    const char *prev, *name;
    size_t k;
    dt_result r;
    if (!m->ops->sync || (r = m->ops->sync(m->ctx)) == DT_OK) return DT_OK;
    prev = dt_last_error();
    name = dt_result_str(r);
    k = strlen(name);
    if (strncmp(prev, name, k) == 0 && prev[k] == ':' && prev[k + 1] == ' ') prev += k + 2;   /* one "DT_ERR_...: " */
    snprintf(msg, sizeof msg, "%s", prev);
    return dt_set_error(r, "%s: %s", what, msg);
}

/* ---- builder ---------------------------------------------------------------------------------- */

static int dt__fail_build(dt_model *m, dt_result r, const char *fmt, ...) {
    if (m->error == DT_OK) {
        va_list ap;
        int n = snprintf(m->error_msg, sizeof m->error_msg, "%s: ", dt_result_str(r));
        va_start(ap, fmt);
        if (n > 0 && (size_t)n < sizeof m->error_msg)
            vsnprintf(m->error_msg + n, sizeof m->error_msg - (size_t)n, fmt, ap);
        va_end(ap);
        m->error = r;
    }
    dt__error_restore(m->error_msg);
    return -1;
}

/* Validates a builder call's input; returns 0 when the call may go on. */
static int dt__check_input(dt_model *m, int x, const char *what) {
    if (!m) { dt_set_error(DT_ERR_INVALID_ARG, "%s: model is NULL", what); return -1; }
    if (m->error != DT_OK) { dt__error_restore(m->error_msg); return -1; }
    if (m->finalized) return dt__fail_build(m, DT_ERR_STATE, "%s: model is already finalized; add every layer before dt_model_finalize", what);
    if (x < 0 || x >= m->nnodes) return dt__fail_build(m, DT_ERR_INVALID_ARG, "%s: input node %d does not exist (model has %d nodes)", what, x, m->nnodes);
    return 0;
}

static dt__node *dt__add_node(dt_model *m, dt_layer_kind kind, int in0) {
    dt__node *n;
    if (m->nnodes == m->cap_nodes) {
        int cap = m->cap_nodes ? 2 * m->cap_nodes : 16;
        dt__node *nn = (dt__node *)DT_REALLOC(m->nodes, sizeof(dt__node) * (size_t)cap);
        if (!nn) { dt__fail_build(m, DT_ERR_OUT_OF_MEMORY, "out of memory growing the node list to %d nodes", cap); return NULL; }
        m->nodes = nn;
        m->cap_nodes = cap;
    }
    n = &m->nodes[m->nnodes];
    memset(n, 0, sizeof *n);
    n->kind = kind;
    n->in0 = in0;
    n->in1 = -1;
    n->param0 = m->npinfo;
    n->buf0 = m->nbinfo;
    if (in0 >= 0) {
        const dt__node *src = &m->nodes[in0];
        n->ndim = src->ndim; n->c = src->c; n->h = src->h; n->w = src->w; n->size = src->size;
    }
    snprintf(n->name, sizeof n->name, "%s%d", dt_layer_kind_str(kind), m->nnodes);
    m->nnodes++;
    return n;
}

static void dt__set_shape3(dt__node *n, int64_t c, int64_t h, int64_t w) {
    n->ndim = 3; n->c = c; n->h = h; n->w = w; n->size = c * h * w;
}
static void dt__set_shape1(dt__node *n, int64_t c) {
    n->ndim = 1; n->c = c; n->h = 1; n->w = 1; n->size = c;
}

/* Adds a parameter (buf = 0) or buffer (buf = 1) view to the node last added. */
static int dt__add_view(dt_model *m, int buf, const char *suffix, int ndim, int64_t s0, int64_t s1, int64_t s2, int64_t s3) {
    dt__pinfo **arr = buf ? &m->binfo : &m->pinfo;
    int *cnt = buf ? &m->nbinfo : &m->npinfo, *cap = buf ? &m->cap_binfo : &m->cap_pinfo;
    dt__pinfo *p;
    dt__node *n = &m->nodes[m->nnodes - 1];
    if (*cnt == *cap) {
        int c2 = *cap ? 2 * *cap : 16;
        dt__pinfo *np = (dt__pinfo *)DT_REALLOC(*arr, sizeof(dt__pinfo) * (size_t)c2);
        if (!np) return dt__fail_build(m, DT_ERR_OUT_OF_MEMORY, "out of memory growing the parameter list");
        *arr = np;
        *cap = c2;
    }
    p = &(*arr)[(*cnt)++];
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s", suffix);   /* full names are made at finalize */
    p->node = m->nnodes - 1;
    p->ndim = ndim;
    p->shape[0] = s0; p->shape[1] = s1; p->shape[2] = s2; p->shape[3] = s3;
    p->count = s0 * (ndim > 1 ? s1 : 1) * (ndim > 2 ? s2 : 1) * (ndim > 3 ? s3 : 1);
    if (buf) { p->offset = m->nbuffers; m->nbuffers += p->count; n->nbufs++; }
    else { p->offset = m->nparams; m->nparams += p->count; n->nparams++; }
    return 0;
}

static const char *const dt__precision_names[DT_PRECISION_COUNT] = {"fp32", "bf16"};
const char *dt_precision_name(dt_precision p) { return p >= 0 && p < DT_PRECISION_COUNT ? dt__precision_names[p] : "unknown"; }
dt_result dt_precision_parse(const char *name, dt_precision *out) {
    int p;
    for (p = 0; name && p < DT_PRECISION_COUNT; p++)
        if (!strcmp(name, dt__precision_names[p])) { if (out) *out = (dt_precision)p; return DT_OK; }
    return dt_set_error(DT_ERR_INVALID_ARG, "precision '%s' is not known: use fp32 or bf16", name ? name : "(null)");
}

dt_result dt_model_create(dt_model **out, const dt_model_desc *desc) {
    dt_model *m;
    dt__node *in;
    if (!out) return dt_set_error(DT_ERR_INVALID_ARG, "dt_model_create: out is NULL");
    *out = NULL;
    if (!desc) return dt_set_error(DT_ERR_INVALID_ARG, "dt_model_create: desc is NULL; pass a dt_model_desc with the input shape");
    if ((int)desc->precision < 0 || desc->precision >= DT_PRECISION_COUNT)
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_model_create: precision %d is not a precision: use DT_PRECISION_FP32 (0, the "
                            "default) or DT_PRECISION_BF16 (1)", (int)desc->precision);
    if (desc->in_c <= 0 || desc->in_h < 0 || desc->in_w < 0 || ((desc->in_h == 0) != (desc->in_w == 0)))
        return dt_set_error(DT_ERR_SHAPE, "dt_model_create: input shape (c=%lld, h=%lld, w=%lld) is invalid; set in_c > 0 and "
                            "either both in_h and in_w > 0 (images) or both 0 (vectors)",
                            (long long)desc->in_c, (long long)desc->in_h, (long long)desc->in_w);
    m = (dt_model *)DT_MALLOC(sizeof *m);
    if (!m) return dt_set_error(DT_ERR_OUT_OF_MEMORY, "dt_model_create: no memory for the model");
    memset(m, 0, sizeof *m);
    m->ops = desc->ops ? desc->ops : dt_cpu_ops();
    m->ctx = desc->ops_ctx;
#ifdef DT__DEFAULT_BACKEND
    {   /* a registered default backend (a CUDA build's GPU): on the given context or on one the model creates */
        const dt_backend *b = DT__DEFAULT_BACKEND();
        if (!desc->ops || desc->ops == b->ops()) {
            m->ops = b->ops();
            if (!m->ctx) {
                void *ctx = NULL;
                dt_result r = b->ctx_create(&ctx);
                if (r != DT_OK) { DT_FREE(m); return r; }
                m->ctx = m->own_ctx = ctx;
                m->own_backend = b;
            }
        }
    }
#endif
    if (m->ops == dt_cpu_ops() && !m->ctx) m->ctx = &m->cpu;   /* workspace placed by dt__reserve */
    if (desc->precision == DT_PRECISION_BF16 && m->ops != dt_cpu_ops()) {
        /* the passes round on the host: a backend of device memory would need an op for it */
        dt_result r = dt_set_error(DT_ERR_UNSUPPORTED, "dt_model_create: precision bf16 runs on the CPU backend only (this "
                                   "model's is %s); use DT_PRECISION_FP32 there", m->ops->name);
        dt_model_destroy(m);
        return r;
    }
    m->bf16 = desc->precision == DT_PRECISION_BF16;
    m->cpu.bf16 = m->bf16;   /* the CPU's GEMMs may then multiply bf16 pairs (dtrain/cpu/cpu.h) */
    m->seed = desc->seed;
    m->stream = desc->stream;
    m->training = 1;
    m->sync_weight = 1;
    m->input_vector = desc->in_h == 0;
    m->input_grad = desc->input_grad != 0;
    in = dt__add_node(m, DT_LAYER_INPUT, -1);
    if (!in) { dt_model_destroy(m); return dt_set_error(DT_ERR_OUT_OF_MEMORY, "dt_model_create: no memory for nodes"); }
    if (m->input_vector) dt__set_shape1(in, desc->in_c);
    else dt__set_shape3(in, desc->in_c, desc->in_h, desc->in_w);
    snprintf(in->name, sizeof in->name, "input");
    *out = m;
    return DT_OK;
}

static void dt__free_arena(dt_model *m) {
    if (m->arena) m->ops->free(m->ctx, m->arena);
    if (m->iarena) m->ops->free(m->ctx, m->iarena);
    m->arena = NULL;
    m->iarena = NULL;
    m->cap_batch = 0;
    m->cpu.gemm_ws = m->cpu.conv_ws = NULL;
    m->cpu.gemm_ws_count = m->cpu.conv_ws_count = 0;
}

void dt_model_destroy(dt_model *m) {
    if (!m) return;
    dt__free_arena(m);
    if (m->params) m->ops->free(m->ctx, m->params);
    if (m->grads) m->ops->free(m->ctx, m->grads);
    if (m->buffers) m->ops->free(m->ctx, m->buffers);
    if (m->sync_dev) m->ops->free(m->ctx, m->sync_dev);
    DT_FREE(m->sync_sum);
    DT_FREE(m->sync_stat);
    DT_FREE(m->sync_host);
    if (m->own_ctx) m->own_backend->ctx_destroy(m->own_ctx);   /* after everything allocated on it */
    DT_FREE(m->nodes);
    DT_FREE(m->pinfo);
    DT_FREE(m->binfo);
    DT_FREE(m);
}

int dt_model_input(dt_model *m) { return m ? 0 : -1; }

int dt_linear(dt_model *m, int x, int64_t out_features, int bias) {
    dt__node *n;
    int64_t in;
    if (dt__check_input(m, x, "dt_linear")) return -1;
    if (m->nodes[x].ndim != 1)
        return dt__fail_build(m, DT_ERR_SHAPE, "dt_linear: input node %d (%s) has shape [%lld, %lld, %lld]; a linear layer needs "
                              "a vector: insert dt_flatten before it", x, m->nodes[x].name, (long long)m->nodes[x].c,
                              (long long)m->nodes[x].h, (long long)m->nodes[x].w);
    if (out_features <= 0) return dt__fail_build(m, DT_ERR_INVALID_ARG, "dt_linear: out_features is %lld; it must be > 0", (long long)out_features);
    in = m->nodes[x].size;
    if (!(n = dt__add_node(m, DT_LAYER_LINEAR, x))) return -1;
    dt__set_shape1(n, out_features);
    n->has_bias = bias != 0;
    if (dt__add_view(m, 0, "weight", 2, out_features, in, 0, 0)) return -1;
    if (n->has_bias && dt__add_view(m, 0, "bias", 1, out_features, 0, 0, 0)) return -1;
    return m->nnodes - 1;
}

/* Window geometry of node n over its input (batch left 0). */
static dt_conv_geom dt__geom(const dt_model *m, const dt__node *n, int64_t batch) {
    const dt__node *src = &m->nodes[n->in0];
    dt_conv_geom g;
    memset(&g, 0, sizeof g);
    g.n = batch; g.c = src->c; g.h = src->h; g.w = src->w;
    g.oc = n->c; g.oh = n->h; g.ow = n->w;
    g.kh = n->kh; g.kw = n->kw; g.sh = n->sh; g.sw = n->sw; g.ph = n->ph; g.pw = n->pw;
    return g;
}

/* The window a desc asks for, into g's kh, kw, sh, sw, ph, pw: the square fields, or with k 0 the rectangular
   ones; a stride 0 becomes 1 (convolution) or the kernel's size (pooling). 0 when it is valid, else -1 with
   the builder's error. */
static int dt__window_desc(dt_model *m, dt_conv_geom *g, int64_t k, int64_t s, int64_t p, int64_t kh, int64_t kw, int64_t sh,
                           int64_t sw, int64_t ph, int64_t pw, int pool, const char *what) {
    if (k != 0 && (kh || kw || sh || sw || ph || pw))
        return dt__fail_build(m, DT_ERR_INVALID_ARG, "%s: kernel is %lld and kernel_h, kernel_w, stride_h, stride_w, pad_h or pad_w "
                              "is set too; give a square window in kernel, stride and pad, or set kernel 0 and give the "
                              "rectangular one", what, (long long)k);
    if (k != 0) { kh = kw = k; sh = sw = s; ph = pw = p; }
    else if (s || p)
        return dt__fail_build(m, DT_ERR_INVALID_ARG, "%s: kernel is 0 but stride (%lld) or pad (%lld) is set; with kernel 0 the "
                              "window is kernel_h x kernel_w, with stride_h, stride_w, pad_h and pad_w", what, (long long)s,
                              (long long)p);
    if (kh <= 0 || kw <= 0 || sh < 0 || sw < 0 || ph < 0 || pw < 0)
        return dt__fail_build(m, DT_ERR_SHAPE, "%s: kernel %lld x %lld, stride %lld x %lld, padding %lld x %lld: the kernel must be "
                              "at least 1 x 1 (kernel, or kernel_h and kernel_w), strides (0: the default) and padding not "
                              "negative", what, (long long)kh, (long long)kw, (long long)sh, (long long)sw, (long long)ph,
                              (long long)pw);
    if (sh == 0) sh = pool ? kh : 1;
    if (sw == 0) sw = pool ? kw : 1;
    if (pool && (ph * 2 > kh || pw * 2 > kw))
        return dt__fail_build(m, DT_ERR_SHAPE, "%s: padding %lld x %lld is more than half the kernel %lld x %lld (PyTorch's limit too)",
                              what, (long long)ph, (long long)pw, (long long)kh, (long long)kw);
    g->kh = kh; g->kw = kw; g->sh = sh; g->sw = sw; g->ph = ph; g->pw = pw;
    return 0;
}

/* Adds a window node over x: a convolution with oc output channels or a pooling (oc = x's channels), with
   the window of w (its kh, kw, sh, sw, ph, pw) */
static int dt__window(dt_model *m, int x, dt_layer_kind kind, int64_t oc, const dt_conv_geom *w, const char *what) {
    dt_conv_geom g = *w;
    dt__node *n;
    const dt__node *src = &m->nodes[x];
    if (src->ndim != 3)
        return dt__fail_build(m, DT_ERR_SHAPE, "%s: input node %d (%s) is a vector of %lld; it needs an image [c, h, w]",
                              what, x, src->name, (long long)src->size);
    if (oc <= 0) return dt__fail_build(m, DT_ERR_INVALID_ARG, "%s: out_channels is %lld; it must be > 0", what, (long long)oc);
    g.c = src->c; g.h = src->h; g.w = src->w;
    if (dt_conv_geom_resolve(&g) != DT_OK) return dt__fail_build(m, DT_ERR_SHAPE, "%s: %s", what, dt_last_error());
    if (!(n = dt__add_node(m, kind, x))) return -1;
    dt__set_shape3(n, oc, g.oh, g.ow);
    n->kh = g.kh; n->kw = g.kw; n->sh = g.sh; n->sw = g.sw; n->ph = g.ph; n->pw = g.pw;
    return m->nnodes - 1;
}

int dt_conv2d_ex(dt_model *m, int x, const dt_conv2d_desc *d) {
    int id;
    dt__node *n;
    dt_conv_geom g;
    if (dt__check_input(m, x, "dt_conv2d")) return -1;
    if (!d) return dt__fail_build(m, DT_ERR_INVALID_ARG, "dt_conv2d_ex: desc is NULL");
    memset(&g, 0, sizeof g);
    if (dt__window_desc(m, &g, d->kernel, d->stride, d->pad, d->kernel_h, d->kernel_w, d->stride_h, d->stride_w, d->pad_h,
                        d->pad_w, 0, "dt_conv2d"))
        return -1;
    if ((id = dt__window(m, x, DT_LAYER_CONV2D, d->out_channels, &g, "dt_conv2d")) < 0) return -1;
    n = &m->nodes[id];
    n->has_bias = !d->no_bias;
    if (dt__add_view(m, 0, "weight", 4, d->out_channels, m->nodes[x].c, g.kh, g.kw)) return -1;
    if (n->has_bias && dt__add_view(m, 0, "bias", 1, d->out_channels, 0, 0, 0)) return -1;
    return id;
}
int dt_conv2d(dt_model *m, int x, int64_t out_channels, int64_t kernel, int64_t stride, int64_t pad) {
    dt_conv2d_desc d;
    if (dt__check_input(m, x, "dt_conv2d")) return -1;
    if (kernel <= 0)   /* in the desc, kernel 0 asks for the rectangular fields */
        return dt__fail_build(m, DT_ERR_SHAPE, "dt_conv2d: kernel is %lld; it must be at least 1", (long long)kernel);
    memset(&d, 0, sizeof d);
    d.out_channels = out_channels; d.kernel = kernel; d.stride = stride; d.pad = pad;
    return dt_conv2d_ex(m, x, &d);
}
static int dt__pool(dt_model *m, int x, dt_layer_kind kind, const dt_pool2d_desc *d, const char *what) {
    dt_conv_geom g;
    if (dt__check_input(m, x, what)) return -1;
    if (!d) return dt__fail_build(m, DT_ERR_INVALID_ARG, "%s_ex: desc is NULL", what);
    memset(&g, 0, sizeof g);
    if (dt__window_desc(m, &g, d->kernel, d->stride, d->pad, d->kernel_h, d->kernel_w, d->stride_h, d->stride_w, d->pad_h,
                        d->pad_w, 1, what))
        return -1;
    return dt__window(m, x, kind, m->nodes[x].c, &g, what);
}
static int dt__pool_square(dt_model *m, int x, dt_layer_kind kind, int64_t kernel, int64_t stride, int64_t pad, const char *what) {
    dt_pool2d_desc d;
    if (dt__check_input(m, x, what)) return -1;
    if (kernel <= 0) return dt__fail_build(m, DT_ERR_SHAPE, "%s: kernel is %lld; it must be at least 1", what, (long long)kernel);
    memset(&d, 0, sizeof d);
    d.kernel = kernel; d.stride = stride; d.pad = pad;
    return dt__pool(m, x, kind, &d, what);
}
int dt_maxpool2d(dt_model *m, int x, int64_t kernel, int64_t stride, int64_t pad) {
    return dt__pool_square(m, x, DT_LAYER_MAXPOOL2D, kernel, stride, pad, "dt_maxpool2d");
}
int dt_avgpool2d(dt_model *m, int x, int64_t kernel, int64_t stride, int64_t pad) {
    return dt__pool_square(m, x, DT_LAYER_AVGPOOL2D, kernel, stride, pad, "dt_avgpool2d");
}
int dt_maxpool2d_ex(dt_model *m, int x, const dt_pool2d_desc *d) { return dt__pool(m, x, DT_LAYER_MAXPOOL2D, d, "dt_maxpool2d"); }
int dt_avgpool2d_ex(dt_model *m, int x, const dt_pool2d_desc *d) { return dt__pool(m, x, DT_LAYER_AVGPOOL2D, d, "dt_avgpool2d"); }

static int dt__unary(dt_model *m, int x, dt_layer_kind kind, const char *what) {
    if (dt__check_input(m, x, what)) return -1;
    if (!dt__add_node(m, kind, x)) return -1;
    return m->nnodes - 1;
}

int dt_global_avgpool(dt_model *m, int x) {
    int id;
    if (dt__check_input(m, x, "dt_global_avgpool")) return -1;
    if (m->nodes[x].ndim != 3)
        return dt__fail_build(m, DT_ERR_SHAPE, "dt_global_avgpool: input node %d (%s) is a vector; it needs an image [c, h, w]",
                              x, m->nodes[x].name);
    if ((id = dt__unary(m, x, DT_LAYER_GLOBAL_AVGPOOL, "dt_global_avgpool")) < 0) return -1;
    dt__set_shape1(&m->nodes[id], m->nodes[x].c);
    return id;
}
int dt_relu(dt_model *m, int x) { return dt__unary(m, x, DT_LAYER_RELU, "dt_relu"); }
int dt_dropout(dt_model *m, int x, float p) {
    int id;
    if (dt__check_input(m, x, "dt_dropout")) return -1;
    if (!(p >= 0.0f && p < 1.0f))
        return dt__fail_build(m, DT_ERR_INVALID_ARG, "dt_dropout: p = %g; it must be in [0, 1)", (double)p);
    if ((id = dt__unary(m, x, DT_LAYER_DROPOUT, "dt_dropout")) < 0) return -1;
    m->nodes[id].p = p;
    return id;
}
int dt_batchnorm_ex(dt_model *m, int x, float eps, float momentum) {
    int id;
    int64_t c;
    if (dt__check_input(m, x, "dt_batchnorm")) return -1;
    if (eps == 0.0f) eps = 1e-5f;
    if (momentum == 0.0f) momentum = 0.1f;
    if (!(eps > 0.0f) || !(momentum > 0.0f && momentum <= 1.0f))
        return dt__fail_build(m, DT_ERR_INVALID_ARG, "dt_batchnorm: eps %g must be > 0 and momentum %g in (0, 1]",
                              (double)eps, (double)momentum);
    if ((id = dt__unary(m, x, DT_LAYER_BATCHNORM, "dt_batchnorm")) < 0) return -1;
    m->nodes[id].eps = eps;
    m->nodes[id].momentum = momentum;
    c = m->nodes[id].c;
    if (dt__add_view(m, 0, "weight", 1, c, 0, 0, 0) || dt__add_view(m, 0, "bias", 1, c, 0, 0, 0) ||
        dt__add_view(m, 1, "running_mean", 1, c, 0, 0, 0) || dt__add_view(m, 1, "running_var", 1, c, 0, 0, 0))
        return -1;
    return id;
}
int dt_batchnorm(dt_model *m, int x) { return dt_batchnorm_ex(m, x, 0.0f, 0.0f); }
int dt_flatten(dt_model *m, int x) {
    int id;
    if ((id = dt__unary(m, x, DT_LAYER_FLATTEN, "dt_flatten")) < 0) return -1;
    dt__set_shape1(&m->nodes[id], m->nodes[x].size);
    m->nodes[id].alias = 1;
    return id;
}
int dt_add(dt_model *m, int a, int b) {
    int id;
    const dt__node *na, *nb;
    if (dt__check_input(m, a, "dt_add") || dt__check_input(m, b, "dt_add")) return -1;
    na = &m->nodes[a]; nb = &m->nodes[b];
    if (na->ndim != nb->ndim || na->c != nb->c || na->h != nb->h || na->w != nb->w)
        return dt__fail_build(m, DT_ERR_SHAPE, "dt_add: node %d (%s) is [%lld, %lld, %lld] but node %d (%s) is [%lld, %lld, %lld]; "
                              "a residual sum needs equal shapes (use dt_pad_shortcut or a 1x1 conv on the shortcut)",
                              a, na->name, (long long)na->c, (long long)na->h, (long long)na->w, b, nb->name,
                              (long long)nb->c, (long long)nb->h, (long long)nb->w);
    if ((id = dt__unary(m, a, DT_LAYER_ADD, "dt_add")) < 0) return -1;
    m->nodes[id].in1 = b;
    return id;
}
int dt_pad_shortcut(dt_model *m, int x, int64_t out_channels, int64_t stride) {
    int id;
    int64_t h, w;
    const dt__node *src;
    if (dt__check_input(m, x, "dt_pad_shortcut")) return -1;
    src = &m->nodes[x];
    if (src->ndim != 3 || out_channels < src->c || (out_channels - src->c) % 2 != 0 || stride <= 0)
        return dt__fail_build(m, DT_ERR_SHAPE, "dt_pad_shortcut: input node %d (%s) with %lld channels cannot be padded to %lld "
                              "channels with stride %lld: it needs an image, out_channels >= in_channels with an even "
                              "difference, and stride > 0", x, src->name, (long long)src->c, (long long)out_channels,
                              (long long)stride);
    h = src->h; w = src->w;   /* (adding the node may move the node array) */
    if ((id = dt__unary(m, x, DT_LAYER_PAD_SHORTCUT, "dt_pad_shortcut")) < 0) return -1;
    dt__set_shape3(&m->nodes[id], out_channels, (h + stride - 1) / stride, (w + stride - 1) / stride);
    m->nodes[id].sh = stride;
    return id;
}
int dt_log_softmax(dt_model *m, int x) {
    if (dt__check_input(m, x, "dt_log_softmax")) return -1;
    if (m->nodes[x].ndim != 1)
        return dt__fail_build(m, DT_ERR_SHAPE, "dt_log_softmax: input node %d (%s) is an image; flatten it first", x, m->nodes[x].name);
    return dt__unary(m, x, DT_LAYER_LOG_SOFTMAX, "dt_log_softmax");
}
int dt_model_set_node_name(dt_model *m, int x, const char *name) {
    size_t len = name ? strlen(name) : 0;
    if (dt__check_input(m, x, "dt_model_set_node_name")) return -1;
    /* at most 60: a parameter's name "<name>.<suffix>" keeps the whole node name (dt__full_names) */
    if (len < 1 || len > 60)
        return dt__fail_build(m, DT_ERR_INVALID_ARG, "dt_model_set_node_name: node %d (%s): the name is %s; give 1 to 60 "
                              "characters", x, m->nodes[x].name, !name ? "NULL" : len ? "longer than 60 characters" : "empty");
    snprintf(m->nodes[x].name, sizeof m->nodes[x].name, "%s", name);
    return x;
}

/* ---- finalize: flat buffers and initialisation ------------------------------------------------ */

static void dt__full_names(dt_model *m, dt__pinfo *arr, int count) {
    int i;
    for (i = 0; i < count; i++) {
        char suffix[80];
        snprintf(suffix, sizeof suffix, "%s", arr[i].name);
        snprintf(arr[i].name, sizeof arr[i].name, "%.60s.%.18s", m->nodes[arr[i].node].name, suffix);
    }
}

/* DT_ERR_OUT_OF_MEMORY, naming what and how much, when `bytes` of host memory planned for m (the CPU backend's
   buffers, the staging copies) cannot fit in the machine: refused before allocating, instead of the kernel's
   silent kill when the pages are first written. */
static dt_result dt__fits_memory(double bytes, const char *fn, const char *what, const char *fix) {
    double phys = dt__phys_bytes();
    if (phys <= 0.0 || bytes <= phys) return DT_OK;
    return dt_set_error(DT_ERR_OUT_OF_MEMORY, "%s: %s need %.1f GB, more than this machine's %.1f GB of memory; %s", fn, what,
                        bytes / 1e9, phys / 1e9, fix);
}

dt_result dt_model_finalize(dt_model *m) {
    float *hp = NULL, *hb = NULL;
    dt_rng rng;
    dt_result r;
    int i;
    if (!m) return dt_set_error(DT_ERR_INVALID_ARG, "dt_model_finalize: model is NULL");
    if (m->error != DT_OK) { dt__error_restore(m->error_msg); return m->error; }
    if (m->finalized) return dt_set_error(DT_ERR_STATE, "dt_model_finalize: the model is already finalized");
    if (m->nnodes < 2) return dt_set_error(DT_ERR_STATE, "dt_model_finalize: the model has no layers; add some with dt_linear, dt_conv2d, ...");
    dt__full_names(m, m->pinfo, m->npinfo);
    dt__full_names(m, m->binfo, m->nbinfo);
    /* the staging copies on the host, and on the CPU backend the parameters, gradients and buffers too */
    r = dt__fits_memory(4.0 * (double)(m->nparams + m->nbuffers) + (m->ctx == &m->cpu ? 4.0 * (double)(2 * m->nparams + m->nbuffers) : 0.0),
                        "dt_model_finalize", "the parameters, their gradients, the buffers and their copies for initialisation", "build a smaller model");
    if (r != DT_OK) return r;
    m->params = (float *)m->ops->alloc(m->ctx, (int64_t)sizeof(float) * m->nparams);
    m->grads = (float *)m->ops->alloc(m->ctx, (int64_t)sizeof(float) * m->nparams);
    m->buffers = (float *)m->ops->alloc(m->ctx, (int64_t)sizeof(float) * m->nbuffers);
    hp = (float *)DT_MALLOC(sizeof(float) * (size_t)(m->nparams + 1));
    hb = (float *)DT_MALLOC(sizeof(float) * (size_t)(m->nbuffers + 1));
    if (!m->params || !m->grads || !m->buffers || !hp || !hb) {
        DT_FREE(hp); DT_FREE(hb);
        return dt_set_error(DT_ERR_OUT_OF_MEMORY, "dt_model_finalize: no memory for %lld parameters and %lld buffer elements",
                            (long long)m->nparams, (long long)m->nbuffers);
    }
    /* PyTorch's defaults: kaiming_uniform_(a=sqrt(5)) gives weights U(-1/sqrt(fan_in), 1/sqrt(fan_in)),
       and biases use the same bound; batchnorm starts at weight 1, bias 0, mean 0, var 1. */
    dt_rng_init(&rng, m->seed, m->stream);
    for (i = 0; i < m->npinfo; i++) {
        const dt__pinfo *p = &m->pinfo[i];
        const dt__node *n = &m->nodes[p->node];
        int64_t j, fan_in = 1;
        int is_bias = strstr(p->name, ".bias") != NULL && strcmp(p->name + strlen(p->name) - 5, ".bias") == 0;
        if (n->kind == DT_LAYER_BATCHNORM) {
            for (j = 0; j < p->count; j++) hp[p->offset + j] = is_bias ? 0.0f : 1.0f;
            continue;
        }
        fan_in = m->pinfo[n->param0].count / m->pinfo[n->param0].shape[0];
        {
            float bound = 1.0f / sqrtf((float)fan_in);
            for (j = 0; j < p->count; j++) hp[p->offset + j] = (2.0f * dt_rng_uniform(&rng) - 1.0f) * bound;
        }
    }
    for (i = 0; i < m->nbinfo; i++) {
        const dt__pinfo *p = &m->binfo[i];
        int64_t j;
        float v = strstr(p->name, "running_var") ? 1.0f : 0.0f;
        for (j = 0; j < p->count; j++) hb[p->offset + j] = v;
    }
    m->ops->upload(m->ctx, m->params, hp, (int64_t)sizeof(float) * m->nparams);
    m->ops->upload(m->ctx, m->buffers, hb, (int64_t)sizeof(float) * m->nbuffers);
    m->ops->fill(m->ctx, m->grads, m->nparams, 0.0f);
    DT_FREE(hp);
    DT_FREE(hb);
    if ((r = dt__sync(m, "dt_model_finalize")) != DT_OK) return r;
    m->finalized = 1;
    return DT_OK;
}


dt_result dt_model_set_mode(dt_model *m, dt_mode mode) {
    if (!m) return dt_set_error(DT_ERR_INVALID_ARG, "dt_model_set_mode: the model is NULL");
    if (mode != DT_MODE_TRAIN && mode != DT_MODE_EVAL)
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_model_set_mode: mode is %d; pass DT_MODE_TRAIN or DT_MODE_EVAL", (int)mode);
    m->training = mode == DT_MODE_TRAIN;
    return DT_OK;
}
dt_mode dt_model_mode(const dt_model *m) { return m && !m->training ? DT_MODE_EVAL : DT_MODE_TRAIN; }

static dt_result dt__need_final(const dt_model *m, const char *what) {
    if (!m) return dt_set_error(DT_ERR_INVALID_ARG, "%s: model is NULL", what);
    if (!m->finalized) return dt_set_error(DT_ERR_STATE, "%s: call dt_model_finalize after building the model", what);
    return DT_OK;
}

/* The accessors dtrain/core/internal.h declares for later modules (the optimizer, evaluation, checkpoints, DDP). */
static inline const dt_ops *dt__model_ops(const dt_model *m, void **ctx) { *ctx = m->ctx; return m->ops; }
static inline int dt__model_finalized(const dt_model *m) { return m->finalized; }
static inline void dt__model_get_rng(const dt_model *m, uint64_t rng[3]) {
    rng[0] = m->seed; rng[1] = m->stream; rng[2] = m->step;
}
static inline void dt__model_set_rng(dt_model *m, const uint64_t rng[3]) {
    m->seed = rng[0]; m->stream = rng[1]; m->step = rng[2];
}
static inline void *dt__model_hook_user(const dt_model *m) { return m->hook_user; }

/* a rank that has joined (dt_ddp_join) runs passes that add nothing to the sums: weight 0 */
static inline void dt__model_bn_sync_weight(dt_model *m, int w) { m->sync_weight = w; }

/* ---- flat buffers and listing --------------------------------------------------------------------- */

float *dt_model_params(dt_model *m, int64_t *count) {
    if (count) *count = m ? m->nparams : 0;
    return m ? m->params : NULL;
}
float *dt_model_grads(dt_model *m, int64_t *count) {
    if (count) *count = m ? m->nparams : 0;
    return m ? m->grads : NULL;
}
float *dt_model_buffers(dt_model *m, int64_t *count) {
    if (count) *count = m ? m->nbuffers : 0;
    return m ? m->buffers : NULL;
}
int64_t dt_model_param_count(const dt_model *m) { return m ? m->nparams : 0; }

static dt_result dt__xfer(dt_model *m, float *dev, float *host_dst, const float *host_src, int64_t have, int64_t count,
                          const char *what) {
    dt_result r;
    if ((r = dt__need_final(m, what)) != DT_OK) return r;
    if (!host_dst && !host_src) return dt_set_error(DT_ERR_INVALID_ARG, "%s: host buffer is NULL", what);
    if (count != have)
        return dt_set_error(DT_ERR_SHAPE, "%s: count is %lld but the model has %lld; the buffer belongs to another model",
                            what, (long long)count, (long long)have);
    if (host_src) m->ops->upload(m->ctx, dev, host_src, (int64_t)sizeof(float) * count);
    else m->ops->download(m->ctx, host_dst, dev, (int64_t)sizeof(float) * count);
    return dt__sync(m, what);
}
dt_result dt_model_set_params(dt_model *m, const float *host, int64_t count) {
    return dt__xfer(m, m ? m->params : NULL, NULL, host, m ? m->nparams : 0, count, "dt_model_set_params");
}
dt_result dt_model_get_params(dt_model *m, float *host, int64_t count) {
    return dt__xfer(m, m ? m->params : NULL, host, NULL, m ? m->nparams : 0, count, "dt_model_get_params");
}
dt_result dt_model_get_grads(dt_model *m, float *host, int64_t count) {
    return dt__xfer(m, m ? m->grads : NULL, host, NULL, m ? m->nparams : 0, count, "dt_model_get_grads");
}
dt_result dt_model_set_buffers(dt_model *m, const float *host, int64_t count) {
    return dt__xfer(m, m ? m->buffers : NULL, NULL, host, m ? m->nbuffers : 0, count, "dt_model_set_buffers");
}
dt_result dt_model_get_buffers(dt_model *m, float *host, int64_t count) {
    return dt__xfer(m, m ? m->buffers : NULL, host, NULL, m ? m->nbuffers : 0, count, "dt_model_get_buffers");
}

int dt_model_param_tensors(const dt_model *m) { return m ? m->npinfo : 0; }
int dt_model_buffer_tensors(const dt_model *m) { return m ? m->nbinfo : 0; }
static dt_param_info dt__info(const dt__pinfo *p) {
    dt_param_info r;
    int i;
    memset(&r, 0, sizeof r);
    if (!p) return r;
    r.name = p->name; r.node = p->node; r.offset = p->offset; r.count = p->count; r.ndim = p->ndim;
    for (i = 0; i < DT_MAX_DIMS; i++) r.shape[i] = p->shape[i];
    return r;
}
dt_param_info dt_model_param_info(const dt_model *m, int i) {
    return dt__info(m && i >= 0 && i < m->npinfo ? &m->pinfo[i] : NULL);
}
dt_param_info dt_model_buffer_info(const dt_model *m, int i) {
    return dt__info(m && i >= 0 && i < m->nbinfo ? &m->binfo[i] : NULL);
}

int dt_model_nodes(const dt_model *m) { return m ? m->nnodes : 0; }
int dt_model_output_node(const dt_model *m) { return m ? m->nnodes - 1 : -1; }
static const dt__node *dt__node_at(const dt_model *m, int node) {
    return (m && node >= 0 && node < m->nnodes) ? &m->nodes[node] : NULL;
}
dt_layer_kind dt_model_node_kind(const dt_model *m, int node) {
    const dt__node *n = dt__node_at(m, node);
    return n ? n->kind : DT_LAYER_KIND_COUNT;
}
const char *dt_model_node_name(const dt_model *m, int node) {
    const dt__node *n = dt__node_at(m, node);
    return n ? n->name : NULL;
}
int64_t dt_model_node_size(const dt_model *m, int node) {
    const dt__node *n = dt__node_at(m, node);
    return n ? n->size : 0;
}
int dt_model_node_shape(const dt_model *m, int node, int64_t shape[3]) {
    const dt__node *n = dt__node_at(m, node);
    if (!n) return 0;
    shape[0] = n->c; shape[1] = n->h; shape[2] = n->w;
    return n->ndim;
}
const float *dt_model_node_output(const dt_model *m, int node) {
    const dt__node *n = dt__node_at(m, node);
    return n && m->batch ? n->out : NULL;
}
const float *dt_model_node_grad(const dt_model *m, int node) {
    const dt__node *n = dt__node_at(m, node);
    return n && m->batch ? n->grad : NULL;
}

void dt_model_summary(const dt_model *m) {
    int i, j;
    if (!m) return;
    dt_log(DT_LOG_INFO, "%-4s %-24s %-15s %-18s %12s", "node", "name", "layer", "output", "params");
    for (i = 0; i < m->nnodes; i++) {
        const dt__node *n = &m->nodes[i];
        char shape[64];
        int64_t np = 0;
        for (j = 0; j < n->nparams; j++) np += m->pinfo[n->param0 + j].count;
        if (n->ndim == 3) snprintf(shape, sizeof shape, "[%lld, %lld, %lld]", (long long)n->c, (long long)n->h, (long long)n->w);
        else snprintf(shape, sizeof shape, "[%lld]", (long long)n->c);
        dt_log(DT_LOG_INFO, "%-4d %-24.24s %-15s %-18s %12lld", i, n->name, dt_layer_kind_str(n->kind), shape, (long long)np);
    }
    dt_log(DT_LOG_INFO, "parameters: %lld trainable, %lld buffer elements", (long long)m->nparams, (long long)m->nbuffers);
}

#ifdef __cplusplus
}
#endif
#endif /* the implementation */
