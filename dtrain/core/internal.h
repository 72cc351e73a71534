/* dtrain/core/internal.h - the library-internal calls between dtrain's modules (not part of the API).

   A module uses of another only its declarations (the public API, and what its declaration part marks
   internal) and what the internal headers declare, under the heading of the module that provides it: this
   file, and for the CPU backend's kernels dtrain/cpu/kernel.h, in the same form. Never another module's
   static helpers or the fields of its private structs (docs/design.md, "The modules"; tools/check_modules.py
   checks it). Each module's implementation part includes this file. Every group is under the macro
   DTRAIN_<NAME>_IMPLEMENTATION_DONE of the module that provides it, which that module defines where its
   implementation part begins (its declarations complete, its bodies to follow in this translation unit), so
   the file may be included by any module whatever came before (not under the include guard DTRAIN_<NAME>_H:
   that is defined before the module's own includes, while its types are not declared yet); it has no
   include guard (a prototype may repeat; a group's type is defined once, under a guard of its own). The
   calls are static: a prototype here, the body in the module's implementation part. Where a later module
   needs a field of a private struct, the module that owns the struct adds a small accessor here rather than
   exposing the struct; the one body here, struct dt_comm (under backend.h), is the view the modules of
   dtrain/comm/ share, as ggml's backend-impl header defines the structs its backends share: to every other
   module dt_comm stays opaque. Keep it small: a public call, where one does the job, is better than a line
   here. make single writes each group in where its module includes this file. */

/* ==== dtrain/cpu/cpu.h: the convolution workspace the model plans for the CPU backend, and its threads ==== */
#ifdef DTRAIN_CPU_IMPLEMENTATION_DONE
static int64_t dt__gemm_ws_count(int threads);
static int64_t dt__tap_ws(const dt_conv_geom *g);
/* the busy-machine watch (dt_cpu_adapt_count): a CPU model's forward pass calls it; workspaces are sized for the
   most threads it may return to */
static void dt__cpu_adapt(void);
static int dt__cpu_threads_most(void);
#endif

/* ==== dtrain/core/nn.h: the model's state for the optimizer, evaluation and checkpoints ==== */
#ifdef DTRAIN_NN_IMPLEMENTATION_DONE
/* DT_OK, or the error (named after what) of a NULL or unfinalized model */
static dt_result dt__need_final(const dt_model *m, const char *what);
/* waits for the backend's ops and returns their first failure, named after what */
static dt_result dt__sync(const dt_model *m, const char *what);
/* the model's ops table, and in *ctx the context its ops take */
static inline const dt_ops *dt__model_ops(const dt_model *m, void **ctx);
/* whether dt_model_finalize succeeded */
static inline int dt__model_finalized(const dt_model *m);
/* the dropout RNG's state (seed, stream, step): read and restored by checkpoints */
static inline void dt__model_get_rng(const dt_model *m, uint64_t rng[3]);
static inline void dt__model_set_rng(dt_model *m, const uint64_t rng[3]);
/* the user pointer of the backward hook (dt_model_set_backward_hook) */
static inline void *dt__model_hook_user(const dt_model *m);
/* a synchronised batch norm's weight in the sums: 1, or 0 on a rank that has joined (dt_ddp_join) */
static inline void dt__model_bn_sync_weight(dt_model *m, int w);
#endif

/* ==== dtrain/core/nn.h: the model's graph, the view the passes share (read by dtrain/core/pass.h) ==== */
#ifdef DTRAIN_NN_IMPLEMENTATION_DONE
#ifndef DT__INTERNAL_MODEL_VIEW
#define DT__INTERNAL_MODEL_VIEW
/* The model: its nodes (a layer each), the listing of its parameters and buffers, the flat buffers, the
   activation arena and the state of a pass. nn.h builds and finalizes it; pass.h runs its passes; to every
   other module dt_model is opaque (the calls of the group above and the public API). */
typedef struct dt__node {
    dt_layer_kind kind;
    int in0, in1;                   /* input node ids (-1 = none) */
    int ndim;                       /* per-sample output: [c] (1) or [c, h, w] (3) */
    int64_t c, h, w, size;
    int64_t kh, kw, sh, sw, ph, pw; /* conv / pool window (pad_shortcut: its stride in sh) */
    int has_bias;
    float p, eps, momentum;         /* dropout, batchnorm */
    int param0, nparams, buf0, nbufs;
    int alias;                      /* 1: output and gradient are the input's (flatten) */
    /* set by dt__plan: */
    int relu;                       /* batchnorm or add: the ReLU node it runs inside itself (0: none) */
    int bn;                         /* add: the batch norm (one of its inputs) it runs too (0: none) */
    unsigned char folded;           /* relu, or batchnorm run by an add: run by another node */
    unsigned char zero;             /* the gradient is zeroed before backward (its first writer adds to it) */
    unsigned char ow[2];            /* the backward pass writes (not adds) the gradient of input 0 / 1 */
    char name[64];
    /* arena pointers, set by dt__reserve */
    float *out, *grad, *aux;        /* aux: dropout mask [batch*size] or batchnorm mean, invstd [2c] */
    int32_t *idx;                   /* maxpool argmax [batch*size] */
    /* synchronised batch norm (dt_model_set_bn_sync): */
    int64_t sync_at;                /* its mean and 1/std on the host, at m->sync_stat + sync_at ([2c]) */
    double sync_count;              /* the values per channel over all ranks in the last forward */
} dt__node;

typedef struct dt__pinfo {
    char name[80];
    int node, ndim;
    int64_t offset, count, shape[DT_MAX_DIMS];
} dt__pinfo;

struct dt_model {
    const dt_ops *ops;
    void *ctx;
    uint64_t seed, stream;
    int input_vector;               /* input is [c] rather than [c, h, w] */
    int input_grad;
    dt__node *nodes;
    int nnodes, cap_nodes;
    dt__pinfo *pinfo, *binfo;
    int npinfo, cap_pinfo, nbinfo, cap_binfo;
    int64_t nparams, nbuffers;
    dt_result error;                /* first builder error, sticky */
    char error_msg[512];
    int finalized, training, seed_ready;
    float *params, *grads, *buffers;
    /* activation arena */
    int64_t cap_batch, batch;
    float *arena;
    int32_t *iarena;
    float *seed_grad;               /* gradient of the loss w.r.t. the output [cap_batch, out size] */
    int32_t *labels;                /* [cap_batch] */
    float *ws;                      /* convolution workspace */
    int64_t ws_count;
    uint64_t step;                  /* forward passes in training mode: the dropout counter */
    dt_backward_hook hook;          /* called after each node's backward (dt_ddp's buckets) */
    void *hook_user;
    /* synchronised batch norm: the sum over the ranks, this rank's weight (0: a rank that has joined, dt_ddp_join),
       the first failure of a pass, host buffers (the sums, the statistics of each batch norm, floats to upload)
       and the backend's buffer of [4 * the most channels] the uploads go to */
    dt_bn_sync_fn sync_fn;
    void *sync_user;
    int sync_weight;
    dt_result sync_err;
    double *sync_sum;
    float *sync_stat, *sync_host, *sync_dev;
    dt__cpu_state cpu;              /* the CPU backend's state (ctx) when no other is given */
    /* DT_PRECISION_BF16: the bf16-rounded operands of the convolutions and linear layers, in the arena: the
       weights [nparams] (the conv and linear weights' places only, rounded at each forward pass), a layer's input
       [batch, in] and output gradient [batch, out] (rounded again where each layer runs) */
    int bf16;
    float *bf16_w, *bf16_x, *bf16_dy;
    void *own_ctx;                  /* a backend context the model created (the registered default's), or NULL */
    const dt_backend *own_backend;  /* the backend that destroys own_ctx */
};
#endif
/* the window of a convolution or pool node over a batch */
static dt_conv_geom dt__geom(const dt_model *m, const dt__node *n, int64_t batch);
/* frees the activation arena (the passes grow it) */
static void dt__free_arena(dt_model *m);
/* DT_OK, or DT_ERR_OUT_OF_MEMORY (fn: what need bytes, more than the machine has; fix) */
static dt_result dt__fits_memory(double bytes, const char *fn, const char *what, const char *fix);
#endif

/* ==== dtrain/core/optim.h: the optimizer's state for checkpoints ==== */
#ifdef DTRAIN_OPTIM_IMPLEMENTATION_DONE
/* the model it updates */
static inline dt_model *dt__optim_model(const dt_optim *o);
/* its settings (kind, lr: a checkpoint restores lr's bits as saved) */
static inline dt_optim_desc *dt__optim_desc(dt_optim *o);
/* its step counts [dt_optim_tensors]: a checkpoint restores them */
static inline int64_t *dt__optim_steps(dt_optim *o);
/* the rate DT_DEFAULT stands for */
static inline float dt__optim_default_lr(dt_optim_kind k);
#endif

/* ==== dtrain/core/partition.h: the seeded shuffles the loader shares ==== */
#ifdef DTRAIN_PARTITION_IMPLEMENTATION_DONE
static void dt__rng_epoch(dt_rng *r, uint64_t seed, uint64_t epoch, uint64_t stream);
static void dt__shuffle(int64_t *a, int64_t n, dt_rng *r);
#endif

/* ==== dtrain/core/data_files.h: file helpers the image-folder loader shares ==== */
#ifdef DTRAIN_DATA_FILES_IMPLEMENTATION_DONE
static int64_t dt__file_size(FILE *fp);
static char *dt__path(const char *dir, const char *name);
static char *dt__str3(const char *a, const char *b, const char *c);
#endif

/* ==== dtrain/comm/comm.h: element types and reductions ==== */
#ifdef DTRAIN_COMM_IMPLEMENTATION_DONE
static int dt__dtype_half(dt_dtype t);
static const char *dt__reduce_name(int op);
#endif

/* ==== dtrain/comm/backend.h: the communicator's state for its algorithms and backends ==== */
#ifdef DTRAIN_BACKEND_IMPLEMENTATION_DONE
#ifndef DT__INTERNAL_COMM_VIEW
#define DT__INTERNAL_COMM_VIEW
/* The communicator of one rank: the view the modules of dtrain/comm/ share (algos.h reads and writes its fields:
   the rank and size, the sequence number and signatures, the sticky failure, the counters), opaque to every other
   module, which reads it through the calls below and the public API. */
struct dt_comm {
    int                    rank, size;
    const dt_comm_backend *backend;
    void                  *impl;            /* backend state */
    dt_comm_desc           desc;            /* the options, defaults filled in; desc.algo is what AUTO means */
    uint64_t               seq;             /* collectives started: the number in error messages */
    uint64_t               sig[3];          /* the operation in progress (its signature) */
    uint64_t               coll_sig[3];     /* the collective in progress, published for other ranks'
                                               mismatch checks (a seqlock: [0] is written last) */
    int                    tag_ub;          /* largest tag the transport carries */
    dt_result              broken;          /* sticky: after a failure every call returns it */
    char                   broken_msg[512];
    dt_comm_stats          stats;
    void                  *scratch;         /* reused by the algorithms */
    size_t                 scratch_bytes;
    dt_request            *reqs;            /* reused by the algorithms */
    int                    nreqs;
    dt__fault              fault;           /* desc.fault parsed: kind 0 = none */
    int                   *node;            /* [size] the backend's nodes (dt_comm_set_nodes); NULL: by desc.node_size */
    int                    ring_nodes;      /* > 0 while DT_ALGO_HIER's leaders run the ring: it is then the ring of
                                               the ring_nodes nodes' leaders (dt__ring_size) */
};
#endif
/* its counters (a backend adds its waits) */
static inline dt_comm_stats *dt__comm_stats(dt_comm *c);
/* the signature [3] of the operation in progress */
static inline const uint64_t *dt__comm_sig(const dt_comm *c);
/* the signature [3] of the collective in progress, published for the other ranks (a seqlock: [0] is written
   last; read it with DT__ATOMIC_LOAD) */
static inline const uint64_t *dt__comm_coll_sig(const dt_comm *c);
/* the name of a kind of operation, 0 <= kind < DT__OP_COUNT (DT__OP_*: backend.h's declarations) */
static inline const char *dt__op_name(int kind);
/* the generic layer: requests, scratch, failures, point-to-point through the backend, reductions */
static inline int dt__comm_any_thread(const dt_comm *c);
static void dt__cancel_all(dt_comm *c, dt_request *reqs, int n);
static const char *dt__cause(const char *m, dt_result r);
static void dt__comm_begin(dt_comm *c, int kind, size_t count, int t, int op, int root, int algo);
static dt_result dt__comm_broken(const dt_comm *c);
static dt_result dt__comm_fail(dt_comm *c, dt_result r, const char *cause);
static dt_result dt__comm_reqs(dt_comm *c, int n, dt_request **out);
static dt_result dt__comm_scratch(dt_comm *c, size_t bytes, void **out);
static void dt__mean_finish(void *buf, size_t n, dt_dtype t, int p);
static int dt__node_of(const dt_comm *c, int k);
static dt_result dt__recv(dt_comm *c, void *buf, size_t bytes, int src, dt_dtype t);
static dt_result dt__recv_reduce(dt_comm *c, void *buf, size_t bytes, int src, void *tmp, dt_dtype t,
                                 dt_reduce_op op);
static void dt__reduce_into(void *DT__RESTRICT dst, const void *DT__RESTRICT src, size_t n, dt_dtype t,
                            dt_reduce_op op);
static dt_result dt__send(dt_comm *c, const void *buf, size_t bytes, int dst, dt_dtype t);
/* requests (dt__req, in backend.h's declarations): posting, waiting, a dt_request's state */
static dt__req *dt__rq(dt_request *q);
static dt_result dt__post(dt_comm *c, int kind, const void *buf, size_t bytes, int peer, int tag, int esize,
                          dt__req *q);
static dt_result dt__isend(dt_comm *c, const void *buf, size_t bytes, int dst, int tag, dt__req *q);
static dt_result dt__irecv(dt_comm *c, void *buf, size_t bytes, int src, int tag, dt__req *q);
static dt_result dt__wait(dt_comm *c, dt__req *q, int exact);
static void dt__sig_str(const uint64_t *sig, char *buf, size_t cap);
static dt_result dt__signal(dt_comm *c, int dst, int src);
static dt_result dt__step(dt_comm *c, const void *sbuf, size_t sbytes, int dst, void *rbuf, size_t rbytes, int src,
                          void *tmp, int reduce, dt_dtype t, dt_reduce_op op);
#endif

/* ==== dtrain/comm/algos.h: the algorithms the local backend reuses; the library's point-to-point ==== */
#ifdef DTRAIN_ALGOS_IMPLEMENTATION_DONE
static dt_result dt__allreduce_ring(dt_comm *c, void *buf, size_t n, dt_dtype t, dt_reduce_op op, void *tmp);
static dt_result dt__alltoall_even(dt_comm *c, const void *send, void *recv, size_t bytes);
static size_t dt__chunk_len(size_t n, int p, int k);
static size_t dt__chunk_off(size_t n, int p, int k);
/* the library's own messages (tags above the user's: DDP, FedAvg, the trace) */
static inline dt_result dt__lib_irecv(dt_comm *c, void *buf, size_t count, dt_dtype t, int src, int tag,
                                      dt_request *req);
static inline dt_result dt__lib_isend(dt_comm *c, const void *buf, size_t count, dt_dtype t, int dst, int tag,
                                      dt_request *req);
static inline dt_result dt__lib_recv(dt_comm *c, void *buf, size_t count, dt_dtype t, int src, int tag,
                                     size_t *received);
static inline dt_result dt__lib_send(dt_comm *c, const void *buf, size_t count, dt_dtype t, int dst, int tag);
static dt_result dt__tree_broadcast(dt_comm *c, void *buf, size_t bytes, int root);
/* under dt_launch, after a rank's function returned DT_OK: a failure when its injected fault never fired */
static dt_result dt__fault_unfired(const dt_comm *c);
static dt_result dt__tree_reduce(dt_comm *c, void *buf, size_t bytes, dt_dtype t, dt_reduce_op op, int root,
                                 void *tmp);
#endif

/* ==== dtrain/comm/launch.h: the threads per rank ==== */
#ifdef DTRAIN_LAUNCH_IMPLEMENTATION_DONE
static int dt__default_threads(int ranks);
#endif

/* ==== dtrain/train/checkpoint.h: the checks and checkpoints every trainer shares ==== */
#ifdef DTRAIN_CHECKPOINT_IMPLEMENTATION_DONE
static dt_result dt__ckpt_load_comm(dt_comm *c, const char *fn, int trainer, const char *path, dt_model *m,
                                    dt_optim *o, dt_checkpoint_meta *meta, int64_t *word, dt_result pre);
static dt_result dt__ckpt_load_extra(dt_comm *c, const char *fn, int trainer, const char *path, dt_model *m,
                                     dt_optim *o, dt_checkpoint_meta *meta, int64_t *word, float *extra,
                                     int64_t nextra, dt_result pre);
static dt_result dt__ckpt_save_comm(dt_comm *c, const char *fn, int trainer, const char *path, dt_model *m,
                                    dt_optim *o, const dt_checkpoint_meta *meta, int64_t word, dt_result pre);
static dt_result dt__ckpt_save_extra(dt_comm *c, const char *fn, int trainer, const char *path, dt_model *m,
                                     dt_optim *o, const dt_checkpoint_meta *meta, int64_t word, float *extra,
                                     int64_t nextra, dt_result pre);
/* every rank's result agreed on: DT_OK, or the lowest failing rank's result and message on every rank */
static dt_result dt__agree(dt_comm *c, dt_result r);
static dt_result dt__same_model(dt_comm *c, dt_model *m, const char *fn, int broadcast, dt_result pre);
/* DT_ERR_NUMERIC unless a number that crossed ranks is finite and in [lo, hi] (the rule for counts and norms) */
static dt_result dt__reduced_check(const dt_comm *c, const char *fn, const char *what, double v, double lo, double hi);
static dt_result dt__trainer_check(const char *fn, int has_out, int has_comm, const dt_comm *c, const dt_model *m,
                                   const char *model);
#endif

/* ==== dtrain/train/compress.h: DDP's compressors (dt__compress, in compress.h's declarations) ==== */
#ifdef DTRAIN_COMPRESS_IMPLEMENTATION_DONE
static dt_result dt__compress_alloc(dt__compress *d, int nslices, const int64_t *soff, const int64_t *scnt);
static dt_result dt__compress_slice(dt__compress *d, int i, float *grads, int64_t off, int64_t cnt, int active,
                                    int64_t samples);
static void dt__compress_free(dt__compress *d);
/* whether a sync's summed slices arrive as the average (FP16 divides before it sends): DDP then divides no more */
static int dt__compress_averaged(const dt__compress *d);
#endif

/* ==== dtrain/train/aggregate.h: FedAvg's aggregation ==== */
#ifdef DTRAIN_AGGREGATE_IMPLEMENTATION_DONE
static dt_result dt__fed_aggregate(const dt_fed_agg_desc *desc, const float *const *updates, const double *weights, int n,
                                   int64_t len, int64_t sel_len, float *out, int *kept_out);
static int dt__fed_min_clients(const dt_fed_agg_desc *a);
#endif
