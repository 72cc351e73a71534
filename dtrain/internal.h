/* dtrain/internal.h - the library-internal calls between dtrain's modules (not part of the API).

   A module uses of another only its declarations (the public API, and what its declaration part marks
   internal) and the calls declared here, under the heading of the module that defines them, never its
   static helpers or the fields of its private structs (docs/design.md, "The modules"; tools/check_modules.py
   checks it). Each module's implementation part includes this file. Every group is under the macro
   DTRAIN_<NAME>_IMPLEMENTATION_DONE of the module that defines it, which that module defines where its
   implementation part begins (its declarations complete, its bodies to follow in this translation unit), so
   the file may be included by any module whatever came before (not under the include guard DTRAIN_<NAME>_H:
   that is defined before the module's own includes, while its types are not declared yet); it has no
   include guard (a prototype may repeat). The calls are static: a prototype here, the body in the module's
   implementation part. Where a later module needs a field of a private struct, the module that owns
   the struct adds a small accessor here rather than exposing the struct. Keep it small: a public call, where
   one does the job, is better than a line here. */

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
#endif

/* ==== dtrain/core/optim.h: the optimizer's state for checkpoints ==== */
#ifdef DTRAIN_OPTIM_IMPLEMENTATION_DONE
/* the model it updates */
static inline dt_model *dt__optim_model(const dt_optim *o);
/* its settings (kind, lr: a checkpoint restores lr's bits as saved) */
static inline dt_optim_desc *dt__optim_desc(dt_optim *o);
/* its step counts [dt_optim_tensors]: a checkpoint restores them */
static inline int64_t *dt__optim_steps(dt_optim *o);
#endif

/* ==== dtrain/comm/backend.h: the communicator's state for its backends ==== */
#ifdef DTRAIN_BACKEND_IMPLEMENTATION_DONE
/* its counters (a backend adds its waits) */
static inline dt_comm_stats *dt__comm_stats(dt_comm *c);
/* the signature [3] of the operation in progress */
static inline const uint64_t *dt__comm_sig(const dt_comm *c);
/* the signature [3] of the collective in progress, published for the other ranks (a seqlock: [0] is written
   last; read it with DT__ATOMIC_LOAD) */
static inline const uint64_t *dt__comm_coll_sig(const dt_comm *c);
#endif
