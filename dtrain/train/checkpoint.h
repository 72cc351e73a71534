/* dtrain/train/checkpoint.h - checkpoints of every rank in one file, and what every trainer shares.
   Part of dtrain v0.1.0, MIT license (see the end of dtrain.h, which is the manual and the one include).

   WHAT IS HERE
     The checkpoint format (version 2): magic, version, world size, writer, one section per rank, checksum;
     atomic writes by rank 0 (write, fsync, rename), loads checked everywhere before any rank changes;
     dt_checkpoint_save and _load (one process) and _comm (collective), and the dt__ckpt calls each trainer's
     save and load go through. And the checks every trainer's create starts with (dt__trainer_check,
     dt__same_model).
   READ FIRST
     dt__ckpt_save, dt__ckpt_load, dt__ckpt_words (the layout of a section).
   USES
     dtrain/core/optim.h and dtrain/comm/comm.h, and what they include.
*/
#ifndef DTRAIN_CHECKPOINT_H
#define DTRAIN_CHECKPOINT_H
#include "../core/optim.h"
#include "../comm/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Checkpoints: parameters, buffers, the model's dropout RNG (seed, stream, step), optimizer state, step
   counts and learning rate, and the caller's progress (dt_checkpoint_meta) - of every rank, in one file.
   The file has a magic number, a version, the world size, the writer (dt_checkpoint_save, or which
   trainer's save), one section per rank with a signature of the model's parameter names and shapes, and a
   checksum. Rank 0 alone writes it: "<path>.tmp", flushed to disk, renamed over path, the directory synced;
   the call returns on every rank only after that, with rank 0's result, so every rank agrees which
   checkpoint is the last complete one and a crash at any moment leaves the previous one whole. Loading
   checks everything before it changes anything: a file that is not a checkpoint, of another version,
   truncated or damaged (the checksum), of another world size, writer or model, or with an optimizer state
   that does not fit is refused with a message naming the file and the cause, on every rank, and no rank's
   model or optimizer changes. A model holding NaN or infinity (a diverged run) is never saved: every rank
   gets DT_ERR_NUMERIC and the checkpoint already at path stays; a file holding such values, or counters
   that are negative or above DT_CHECKPOINT_MAX_COUNT, is refused on load. Rank 0 stages the whole file in memory (one section per rank). */
#define DT_CHECKPOINT_VALUES 8
/* The largest epoch, step, round or batch a checkpoint holds (2^48: a million steps a second for eight years);
   a larger or negative one is refused on save and on load (a damaged file, or one not written by dtrain). */
#define DT_CHECKPOINT_MAX_COUNT ((int64_t)1 << 48)
typedef struct dt_checkpoint_meta {
    int64_t epoch, step, round;   /* the caller's counters: e.g. epochs completed */
    int64_t batch;                /* batches of the current epoch done: where dt_loader_seek resumes */
    dt_rng  rng;                  /* any RNG the caller wants restored */
    double  values[DT_CHECKPOINT_VALUES];  /* any numbers the caller wants restored, e.g. running loss sums */
    uint32_t sum_values;          /* load, not saved: bit j set says values[j] is a sum over the ranks (each rank's
                                     share of a total): a trainer's checkpoint loaded by another number of ranks gives
                                     new rank r the sum over the old ranks o with o mod (the new world) = r; the
                                     other values are rank 0's on every rank */
} dt_checkpoint_meta;
/* One process (the single-process loop): a checkpoint of one rank. o may be NULL (no optimizer state saved);
   meta may be NULL (zeros). */
dt_result dt_checkpoint_save(const char *path, dt_model *m, dt_optim *o, const dt_checkpoint_meta *meta);
/* o NULL skips the optimizer state in the file; meta NULL skips the counters. */
dt_result dt_checkpoint_load(const char *path, dt_model *m, dt_optim *o, dt_checkpoint_meta *meta);
/* Collective: the same for every rank of c (its model m, optimizer o, meta), e.g. a loop of your own over the
   communicator; on one rank the file is dt_checkpoint_save's. Each rank gets its own section back. */
dt_result dt_checkpoint_save_comm(dt_comm *c, const char *path, dt_model *m, dt_optim *o, const dt_checkpoint_meta *meta);
dt_result dt_checkpoint_load_comm(dt_comm *c, const char *path, dt_model *m, dt_optim *o, dt_checkpoint_meta *meta);
/* Each trainer saves and resumes through its own pair (dt_ddp_save, dt_localsgd_save, dt_dpsgd_save,
   dt_fed_save and their _load), declared with it (ddp.h, localsgd.h, dpsgd.h, fedavg.h): the same file with the
   trainer's state added. */

/* Internal (for the trainers' dt__ckpt_save_comm and dt__ckpt_load_comm, not the API): which call wrote a
   checkpoint; each trainer's resume reads only its own. */
enum { DT__CKPT_PLAIN = 0, DT__CKPT_DDP, DT__CKPT_LOCALSGD, DT__CKPT_DPSGD, DT__CKPT_FEDAVG, DT__CKPT_TRAINERS };
#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_CHECKPOINT_H */

#if defined(DTRAIN_IMPLEMENTATION) && !defined(DTRAIN_CHECKPOINT_IMPLEMENTATION_DONE)
#define DTRAIN_CHECKPOINT_IMPLEMENTATION_DONE

#ifdef __cplusplus
extern "C" {
#endif
#include "../core/internal.h"

/* ---- checkpoints ----
   Version 2. One file holds every rank's state, written by rank 0 alone, so that its atomicity is one
   rename: a crash before the rename leaves the previous checkpoint whole, and no file ever mixes ranks of
   two checkpoints. Every number in it is little-endian, on every host (a big-endian one swaps them as it
   writes and reads: dt__le32), so a file moves between hosts bit for bit. The file: the magic, then 64-bit
   words: the version, the world size, the trainer (DT__CKPT_PLAIN, ...), each rank's section size in bytes
   [world]; then the sections in rank order; then the FNV-1a checksum of everything before it. A section:
   DT__CKPT_SEC_WORDS words (see dt__ckpt_words), then the parameters, buffers and optimizer state (float32),
   the per-tensor step counts (int64) and the trainer's floats. Everything is staged in memory: rank 0 holds
   the whole file while it writes or reads. */

#define DT__CKPT_MAGIC "DTCKPT\r\n"
#define DT__CKPT_VERSION 2u
#define DT__CKPT_HEAD_WORDS 3          /* version, world, trainer; then the sizes */
#define DT__CKPT_SEC_WORDS (19 + DT_CHECKPOINT_VALUES)

static const char *const dt__ckpt_writers[DT__CKPT_TRAINERS] = {
    "dt_checkpoint_save(_comm)", "dt_ddp_save", "dt_localsgd_save", "dt_dpsgd_save", "dt_fed_save"};

/* FNV-1a, 64-bit, over bytes: the checksum and the model signature */
static uint64_t dt__fnv(uint64_t h, const void *data, size_t n) {
    const unsigned char *p = (const unsigned char *)data;
    size_t i;
    for (i = 0; i < n; i++) { h ^= p[i]; h *= 0x100000001b3ULL; }
    return h;
}
#ifdef DT__TEST_HOOKS   /* the test programs' handles (tests/dt_test_hooks.h; compiled in by tests/impl_test.c) */
uint64_t dt__test_fnv(uint64_t h, const void *data, size_t n);
int64_t dt__test_ckpt_words(int section);
uint64_t dt__test_fnv(uint64_t h, const void *data, size_t n) { return dt__fnv(h, data, n); }
int64_t dt__test_ckpt_words(int section) { return section ? DT__CKPT_SEC_WORDS : DT__CKPT_HEAD_WORDS; }   /* a section's, the header's */
#endif
static uint64_t dt__model_signature(const dt_model *m) {
    uint64_t h = 0xcbf29ce484222325ULL;
    int i;
    for (i = 0; i < dt_model_param_tensors(m); i++) {
        dt_param_info t = dt_model_param_info(m, i);
        unsigned char shape[8 * DT_MAX_DIMS];   /* little-endian, as every host hashes it */
        int d;
        for (d = 0; d < DT_MAX_DIMS; d++) dt__put_le64(shape + 8 * d, (uint64_t)t.shape[d]);
        h = dt__fnv(h, t.name, strlen(t.name));
        h = dt__fnv(h, shape, sizeof shape);
    }
    for (i = 0; i < dt_model_buffer_tensors(m); i++) {
        dt_param_info t = dt_model_buffer_info(m, i);
        h = dt__fnv(h, t.name, strlen(t.name));
    }
    return h;
}


/* One rank's part of a checkpoint call. */
typedef struct dt__ckpt {
    dt_comm   *c;          /* NULL: one process, no communicator */
    int        rank, world, trainer;
    int        saved_world;  /* load: the world that saved the file (another: dt__ckpt_elastic) */
    const char *fn, *path;
    dt_model  *m;
    dt_optim  *o;
    int64_t    word;       /* the trainer's own state (local SGD: steps since the last average) */
    float     *extra;      /* [nextra] the trainer's own floats (DDP's residual and PowerSGD's Qs), host memory; or NULL */
    int64_t    nextra;
} dt__ckpt;

static int64_t dt__ckpt_state(const dt__ckpt *k) {
    int64_t n = 0;
    if (k->o) dt_optim_state(k->o, &n);
    return n;
}
/* The model's floats in a section: its parameters, then its buffers. */
static int64_t dt__ckpt_model_floats(const dt__ckpt *k) {
    int64_t nparams, nbuffers;
    dt_model_params(k->m, &nparams);
    dt_model_buffers(k->m, &nbuffers);
    return nparams + nbuffers;
}
static int64_t dt__ckpt_section_bytes(const dt__ckpt *k) {
    return 8 * DT__CKPT_SEC_WORDS + 4 * (dt__ckpt_model_floats(k) + dt__ckpt_state(k)) +
           8 * (int64_t)(k->o ? dt_optim_tensors(k->o) : 0) + 4 * k->nextra;
}

/* The words of a section: rank, model signature, parameters, buffer values, optimizer state values and
   tensors (0: no optimizer), optimizer kind and learning rate (its float's bits), the model's dropout RNG
   (seed, stream, step), the meta (epoch, step, round, batch, RNG state and increment, the values' bits),
   the trainer's word and its floats' count (0 in files written before there were any). */
static void dt__ckpt_words(const dt__ckpt *k, const dt_checkpoint_meta *meta, uint64_t *w) {
    dt_checkpoint_meta z;
    uint32_t lr = 0;
    float f = k->o ? dt_optim_lr(k->o) : 0.0f;
    int64_t nparams, nbuffers;
    int i;
    memset(&z, 0, sizeof z);
    if (!meta) meta = &z;
    memcpy(&lr, &f, sizeof lr);
    dt_model_params(k->m, &nparams);
    dt_model_buffers(k->m, &nbuffers);
    w[0] = (uint64_t)k->rank; w[1] = dt__model_signature(k->m); w[2] = (uint64_t)nparams;
    w[3] = (uint64_t)nbuffers; w[4] = (uint64_t)dt__ckpt_state(k); w[5] = (uint64_t)(k->o ? dt_optim_tensors(k->o) : 0);
    w[6] = k->o ? (uint64_t)dt__optim_desc(k->o)->kind : 0; w[7] = lr;
    dt__model_get_rng(k->m, &w[8]);   /* seed, stream, step: w[8..10] */
    w[11] = (uint64_t)meta->epoch; w[12] = (uint64_t)meta->step; w[13] = (uint64_t)meta->round;
    w[14] = (uint64_t)meta->batch; w[15] = meta->rng.state; w[16] = meta->rng.inc;
    w[17] = (uint64_t)k->word; w[18] = (uint64_t)k->nextra;
    for (i = 0; i < DT_CHECKPOINT_VALUES; i++) memcpy(&w[19 + i], &meta->values[i], sizeof(double));
}

/* A section's floats (parameters, buffers, optimizer state, the trainer's floats; w: its words) in place, from the
   host's order to the file's (little-endian) or back; nothing on a little-endian host. */
static void dt__ckpt_floats_order(unsigned char *sec, const uint64_t *w) {
    int64_t nf = (int64_t)(w[2] + w[3] + w[4]);
    dt__le32(sec + 8 * DT__CKPT_SEC_WORDS, (size_t)nf);
    dt__le32(sec + 8 * DT__CKPT_SEC_WORDS + 4 * nf + 8 * (int64_t)w[5], (size_t)w[18]);
}

/* This rank's section into sec [dt__ckpt_section_bytes], in the file's order. */
static void dt__ckpt_write_section(const dt__ckpt *k, const dt_checkpoint_meta *meta, unsigned char *sec) {
    uint64_t w[DT__CKPT_SEC_WORDS];
    void *ctx;
    const dt_ops *ops = dt__model_ops(k->m, &ctx);
    int64_t nparams, nbuffers, ns = dt__ckpt_state(k), i;
    float *params = dt_model_params(k->m, &nparams), *buffers = dt_model_buffers(k->m, &nbuffers);
    int ntensors = k->o ? dt_optim_tensors(k->o) : 0;
    unsigned char *p = sec + 8 * DT__CKPT_SEC_WORDS;
    dt__ckpt_words(k, meta, w);
    for (i = 0; i < DT__CKPT_SEC_WORDS; i++) dt__put_le64(sec + 8 * i, w[i]);
    ops->download(ctx, p, params, 4 * nparams);
    p += 4 * nparams;
    if (nbuffers) ops->download(ctx, p, buffers, 4 * nbuffers);
    p += 4 * nbuffers;
    if (ns) ops->download(ctx, p, dt_optim_state(k->o, NULL), 4 * ns);
    p += 4 * ns;
    for (i = 0; i < ntensors; i++) dt__put_le64(p + 8 * i, (uint64_t)dt_optim_tensor_steps(k->o, (int)i));
    p += 8 * ntensors;
    if (k->nextra) memcpy(p, k->extra, 4 * (size_t)k->nextra);
    dt__ckpt_floats_order(sec, w);
}

/* The values of a section [len] that must be finite (parameters, buffers, optimizer state: the floats after its
   words, `nf` of them) and its counters, never negative nor above DT_CHECKPOINT_MAX_COUNT: a section that holds NaN or infinity
   comes from a diverged run, and saving it would replace a good checkpoint with a useless one. `doing` says
   "save" or "load" for the message. */
static dt_result dt__ckpt_check_values(const dt__ckpt *k, const unsigned char *sec, int64_t nf, const char *doing) {
    const unsigned char *p = sec + 8 * DT__CKPT_SEC_WORDS;
    int64_t i, bad = 0, first = -1;
    for (i = 0; i < nf; i++) {
        float v;
        memcpy(&v, p + 4 * i, sizeof v);
        dt__le32(&v, 1);
        if (!(v - v == 0.0f)) { bad++; if (first < 0) first = i; }   /* NaN or infinity */
    }
    for (i = 11; i <= 14; i++) {   /* epoch, step, round, batch */
        static const char *const names[4] = {"epoch", "step", "round", "batch"};
        int64_t v = (int64_t)dt__get_le64(sec + 8 * i);
        if (v < 0 || v > DT_CHECKPOINT_MAX_COUNT)
            return doing[0] == 's'
                ? dt_set_error(DT_ERR_INVALID_ARG, "%s: rank %d: the meta's %s is %lld (%s): nothing is written to %s", k->fn,
                               k->rank, names[i - 11], (long long)v, v < 0 ? "negative" : "above DT_CHECKPOINT_MAX_COUNT, 2^48", k->path)
                : dt_set_error(DT_ERR_FORMAT, "%s: rank %d: %s holds the %s %lld (%s): the file is damaged or was not written "
                               "by dtrain", k->fn, k->rank, k->path, names[i - 11], (long long)v,
                               v < 0 ? "negative" : "above DT_CHECKPOINT_MAX_COUNT, 2^48");
    }
    if (!bad) return DT_OK;
    if (doing[0] == 's')
        return dt_set_error(DT_ERR_NUMERIC, "%s: rank %d: %lld of its %lld values (parameters, buffers, optimizer state; the first "
                            "at %lld) are NaN or infinite: the model diverged; nothing is written (a checkpoint already at %s is "
                            "kept: resume from it with a lower learning rate)", k->fn, k->rank, (long long)bad,
                            (long long)nf, (long long)first, k->path);
    return dt_set_error(DT_ERR_FORMAT, "%s: rank %d: %s holds %lld NaN or infinite values (the first at %lld): it was saved "
                        "from a diverged run or is damaged; use an earlier checkpoint", k->fn, k->rank, k->path, (long long)bad,
                        (long long)first);
}

/* The second half of an agreement on a result, once every rank knows the lowest rank that failed, first (its
   result and message travel from there, two broadcasts): a rank that did not fail returns them; one that failed
   keeps its own (own 1) or takes them too (own 0). */
static dt_result dt__agree_tell(dt_comm *c, dt_result r, int first, int own) {
    int64_t code = (int64_t)r;
    char msg[512], mine[DT__ERROR_CAP];
    dt_result e;
    snprintf(mine, sizeof mine, "%s", dt_last_error());
    memset(msg, 0, sizeof msg);
    if (first == dt_comm_rank(c)) {
        const char *s = dt_last_error();
        size_t pre = strlen(dt_result_str(r));   /* without its "DT_ERR_...: ", which dt_set_error adds back */
        if (strncmp(s, dt_result_str(r), pre) == 0 && s[pre] == ':') s += pre + (s[pre + 1] == ' ' ? 2 : 1);
        snprintf(msg, sizeof msg, "%s", s);
    }
    if ((e = dt_comm_broadcast(c, &code, 1, DT_I64, first, DT_ALGO_AUTO)) != DT_OK ||
        (e = dt_comm_broadcast(c, msg, sizeof msg, DT_U8, first, DT_ALGO_AUTO)) != DT_OK) return e;
    if (own && r != DT_OK) { dt__error_restore(mine); return r; }
    msg[sizeof msg - 1] = 0;
    return dt_set_error((dt_result)code, "%s", msg);
}
/* Collective agreement on a result: every rank returns DT_OK, or the result and message of the lowest rank
   that failed (so all ranks report the same cause). c NULL: r. */
static dt_result dt__agree(dt_comm *c, dt_result r) {
    int64_t first;
    dt_result e;
    if (!c || dt_comm_size(c) == 1) return r;
    first = r != DT_OK ? dt_comm_rank(c) : dt_comm_size(c);
    if ((e = dt_comm_allreduce(c, &first, 1, DT_I64, DT_MIN, DT_ALGO_AUTO)) != DT_OK) return e;
    return first == dt_comm_size(c) ? DT_OK : dt__agree_tell(c, r, (int)first, 0);
}
static dt_result dt__ckpt_agree(const dt__ckpt *k, dt_result r) { return dt__agree(k->c, r); }

/* Rank 0: writes file [bytes] to "<path>.tmp", flushes it to disk, renames it over path, syncs the directory. */
static dt_result dt__ckpt_write_file(const dt__ckpt *k, const unsigned char *file, int64_t bytes) {
    char tmp[1024];
    FILE *f;
    dt_result r = DT_OK;
    int err;
    if (snprintf(tmp, sizeof tmp, "%s.tmp", k->path) >= (int)sizeof tmp)
        return dt_set_error(DT_ERR_INVALID_ARG, "%s: path is too long", k->fn);
    if (!(f = fopen(tmp, "wb")))
        return dt_set_error(DT_ERR_IO, "%s: cannot create %s (does the directory exist and is it writable?)", k->fn, tmp);
    if (fwrite(file, 1, (size_t)bytes, f) != (size_t)bytes || dt__file_sync(f) != 0)
        r = dt_set_error(DT_ERR_IO, "%s: writing %s failed (disk full?); the previous %s is untouched", k->fn, tmp, k->path);
    if (fclose(f) != 0 && r == DT_OK)
        r = dt_set_error(DT_ERR_IO, "%s: closing %s failed; the previous %s is untouched", k->fn, tmp, k->path);
    if (r == DT_OK && (err = dt__file_replace(tmp, k->path)) != 0)
        r = dt_set_error(DT_ERR_IO, "%s: cannot rename %s to %s: %s", k->fn, tmp, k->path, strerror(err));
    if (r != DT_OK) remove(tmp);
    else dt__dir_sync(k->path);
    return r;
}

/* Collective (or one process with k->c NULL): every rank's section, gathered by rank 0, which writes the file.
   Every rank returns rank 0's result: the checkpoint exists for all of them once the file is complete. */
static dt_result dt__ckpt_save(dt__ckpt *k, const dt_checkpoint_meta *meta) {
    int64_t mine = dt__ckpt_section_bytes(k), most = 0, head, bytes = 0, off, i;
    int64_t *sizes = (int64_t *)DT_MALLOC(sizeof(int64_t) * (size_t)k->world);
    unsigned char *sec = NULL, *file = NULL, *slots = NULL;
    dt_result r = DT_OK;
    if (!sizes) r = dt_set_error(DT_ERR_OUT_OF_MEMORY, "%s: rank %d: no memory", k->fn, k->rank);
    if ((r = dt__ckpt_agree(k, r)) != DT_OK) { DT_FREE(sizes); return r; }
    sizes[0] = mine;
    if (k->c && k->world > 1 && (r = dt_comm_allgather(k->c, &mine, sizes, 1, DT_I64)) != DT_OK) { DT_FREE(sizes); return r; }
    head = 8 + 8 * (DT__CKPT_HEAD_WORDS + k->world);
    for (i = 0; i < k->world; i++) { most = sizes[i] > most ? sizes[i] : most; bytes += sizes[i]; }
    bytes += head + 8;
    sec = (unsigned char *)DT_MALLOC((size_t)most);   /* padded to the largest, for one gather */
    if (k->rank == 0) {
        file = (unsigned char *)DT_MALLOC((size_t)bytes);
        slots = (unsigned char *)DT_MALLOC((size_t)(most * k->world));
    }
    if (!sec || (k->rank == 0 && (!file || !slots)))
        r = dt_set_error(DT_ERR_OUT_OF_MEMORY, "%s: rank %d: no memory to stage %lld bytes of checkpoint", k->fn, k->rank,
                         (long long)(k->rank == 0 ? bytes + most * (k->world + 1) : most));
    if ((r = dt__ckpt_agree(k, r)) == DT_OK) {
        memset(sec, 0, (size_t)most);
        dt__ckpt_write_section(k, meta, sec);
        r = dt__ckpt_agree(k, dt__ckpt_check_values(k, sec, dt__ckpt_model_floats(k) + dt__ckpt_state(k), "save"));
    }
    if (r == DT_OK) {
        if (k->c && k->world > 1) r = dt_comm_gather(k->c, sec, slots, (size_t)most, DT_U8, 0);
        else memcpy(slots, sec, (size_t)most);
    }
    if (r == DT_OK && k->rank == 0) {
        memcpy(file, DT__CKPT_MAGIC, 8);
        dt__put_le64(file + 8, DT__CKPT_VERSION);
        dt__put_le64(file + 16, (uint64_t)k->world);
        dt__put_le64(file + 24, (uint64_t)k->trainer);
        for (i = 0, off = head; i < k->world; off += sizes[i], i++) {
            dt__put_le64(file + 32 + 8 * i, (uint64_t)sizes[i]);
            memcpy(file + off, slots + i * most, (size_t)sizes[i]);
        }
        dt__put_le64(file + bytes - 8, dt__fnv(0xcbf29ce484222325ULL, file, (size_t)(bytes - 8)));
        r = dt__ckpt_write_file(k, file, bytes);
    }
    DT_FREE(sizes); DT_FREE(sec); DT_FREE(file); DT_FREE(slots);
    return dt__ckpt_agree(k, r);
}

/* Rank 0: the whole file into *file [*bytes]. */
static dt_result dt__ckpt_read_file(const dt__ckpt *k, unsigned char **file, int64_t *bytes) {
    FILE *f;
    long size;
    const char *why;
    *file = NULL;
    if (!(f = dt__open_read(k->path, &why)))   /* a FIFO is refused, not waited on */
        return dt_set_error(DT_ERR_IO, "%s: cannot open %s: %s", k->fn, k->path, why);
    if (fseek(f, 0, SEEK_END) != 0 || (size = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0) {
        fclose(f);
        return dt_set_error(DT_ERR_IO, "%s: cannot read %s", k->fn, k->path);
    }
    if (!(*file = (unsigned char *)DT_MALLOC((size_t)size + 1))) {
        fclose(f);
        return dt_set_error(DT_ERR_OUT_OF_MEMORY, "%s: no memory to stage %s (%ld bytes)", k->fn, k->path, size);
    }
    *bytes = (int64_t)size;
    if (fread(*file, 1, (size_t)size, f) != (size_t)size) {
        fclose(f);
        return dt_set_error(DT_ERR_IO, "%s: reading %s failed", k->fn, k->path);
    }
    fclose(f);
    return DT_OK;
}

/* Whether a trainer's checkpoint resumes on another number of ranks, and how (docs/design.md, "Checkpoints"):
   FedAvg's state is rank 0's (the global model and the server optimizer; the clients are drawn from (seed, round)
   and start each round from the global model, whichever rank trains them): every rank of the new world loads the
   old rank 0's section. DDP's replicas are equal, local SGD's are averaged every period and D-PSGD's average is
   the model it evaluates: every rank loads the mean of the old ranks' parameters, buffers, optimizer state and
   trainer floats (DDP's residuals: their mean keeps the update not yet sent), with rank 0's counters and word.
   Either way each rank keeps its own dropout stream, and the meta is rank 0's, but for the values the caller marks
   as sums over the ranks (meta.sum_values): new rank r gets the sum of those of the old ranks o with o mod M = r,
   so that the totals stay. A plain dt_checkpoint_save_comm file is the caller's own loop's, and needs its world. */
enum { DT__ELASTIC_NO = 0, DT__ELASTIC_RANK0, DT__ELASTIC_MEAN };
static int dt__ckpt_elastic(int trainer) {
    return trainer == DT__CKPT_FEDAVG ? DT__ELASTIC_RANK0 : trainer == DT__CKPT_PLAIN ? DT__ELASTIC_NO : DT__ELASTIC_MEAN;
}
static float dt__get_lef32(const unsigned char *p) {
    uint32_t u = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
static void dt__put_lef32(unsigned char *p, float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    p[0] = (unsigned char)u; p[1] = (unsigned char)(u >> 8); p[2] = (unsigned char)(u >> 16); p[3] = (unsigned char)(u >> 24);
}
/* Rank 0, a file of another world (saved ranks, each section `size` bytes at sec): the new world's sections into
   slots [k->world * size], by dt__ckpt_elastic's rule. */
static void dt__ckpt_remap(const dt__ckpt *k, const unsigned char *sec, int saved, int64_t size, unsigned char *slots,
                           uint32_t sums) {
    uint64_t w[DT__CKPT_SEC_WORDS];
    int64_t nf, at, f, j;
    int o, r;
    memcpy(slots, sec, (size_t)size);   /* rank 0's words, counters and step counts */
    for (j = 0; j < DT__CKPT_SEC_WORDS; j++) w[j] = dt__get_le64(sec + 8 * j);
    nf = (int64_t)(w[2] + w[3] + w[4]);
    if (dt__ckpt_elastic(k->trainer) == DT__ELASTIC_MEAN)
        for (f = 0; f < nf + (int64_t)w[18]; f++) {   /* the model's and optimizer's floats, then the trainer's */
            double sum = 0.0;
            at = 8 * DT__CKPT_SEC_WORDS + 4 * f + (f < nf ? 0 : 8 * (int64_t)w[5]);
            for (o = 0; o < saved; o++) sum += (double)dt__get_lef32(sec + o * size + at);
            dt__put_lef32(slots + at, (float)(sum / saved));
        }
    for (r = 1; r < k->world; r++) memcpy(slots + r * size, slots, (size_t)size);
    for (r = 0; r < k->world; r++)
        for (j = 0; j < DT_CHECKPOINT_VALUES && j < 32; j++) {   /* the values that are sums: the old ranks o with o mod world = r */
            double sum = 0.0, v;
            uint64_t bits;
            if (!(sums >> j & 1u)) continue;
            for (o = r; o < saved; o += k->world) {
                bits = dt__get_le64(sec + o * size + 8 * (19 + j));
                memcpy(&v, &bits, sizeof v);
                sum += v;
            }
            memcpy(&bits, &sum, sizeof sum);
            dt__put_le64(slots + r * size + 8 * (19 + j), bits);
        }
}

/* Rank 0: the checks of the whole file, in the order that makes each message true: what it is (magic,
   version), whether it is whole (sizes, checksum), then whether it fits this run (world size, trainer).
   sizes [k->world + 1] receives the sections' sizes (rank 0's for every rank when the file has another world)
   and, last, the file's world. */
static dt_result dt__ckpt_check_file(const dt__ckpt *k, const unsigned char *file, int64_t bytes, int64_t *sizes) {
    uint64_t version, world, trainer, i;
    int64_t head, sum = 0;
    if (bytes < 8 + 8 * DT__CKPT_HEAD_WORDS + 8 || memcmp(file, DT__CKPT_MAGIC, 8) != 0)   /* + the checksum */
        return dt_set_error(DT_ERR_FORMAT, "%s: %s is not a dtrain checkpoint (wrong magic number or too short)", k->fn, k->path);
    version = dt__get_le64(file + 8); world = dt__get_le64(file + 16); trainer = dt__get_le64(file + 24);
    if (version != DT__CKPT_VERSION)
        return dt_set_error(DT_ERR_FORMAT, "%s: %s has format version %llu; this dtrain reads version %u%s", k->fn, k->path,
                            (unsigned long long)version, DT__CKPT_VERSION,
                            version == 1 ? " (version 1 held one model; save it again with this dtrain)" : "");
    if (world < 1 || world > (uint64_t)(bytes - 8 - 8 * DT__CKPT_HEAD_WORDS - 8) / 8)
        return dt_set_error(DT_ERR_FORMAT, "%s: %s is truncated or damaged (a world of %llu ranks in %lld bytes)", k->fn,
                            k->path, (unsigned long long)world, (long long)bytes);
    head = 8 + 8 * (DT__CKPT_HEAD_WORDS + (int64_t)world);
    for (i = 0; i < world && sum <= bytes; i++) {
        uint64_t s = dt__get_le64(file + 32 + 8 * i);
        sum = s < 8 * DT__CKPT_SEC_WORDS || s > (uint64_t)bytes ? bytes + 1 : sum + (int64_t)s;
    }
    if (sum + head + 8 != bytes)
        return dt_set_error(DT_ERR_FORMAT, "%s: %s is %lld bytes, which is not what its header describes: the file is "
                            "truncated or damaged; use an earlier checkpoint", k->fn, k->path, (long long)bytes);
    if (dt__fnv(0xcbf29ce484222325ULL, file, (size_t)(bytes - 8)) != dt__get_le64(file + bytes - 8))
        return dt_set_error(DT_ERR_FORMAT, "%s: %s is damaged (checksum mismatch); use an earlier checkpoint", k->fn, k->path);
    if (world != (uint64_t)k->world && dt__ckpt_elastic(k->trainer) == DT__ELASTIC_NO)
        return dt_set_error(DT_ERR_FORMAT, "%s: %s holds the state of %llu ranks but this run has %d: resume on %llu ranks",
                            k->fn, k->path, (unsigned long long)world, k->world, (unsigned long long)world);
    if (trainer != (uint64_t)k->trainer)
        return dt_set_error(DT_ERR_FORMAT, "%s: %s was written by %s; %s reads what %s writes: resume with the trainer that "
                            "wrote it", k->fn, k->path, trainer < DT__CKPT_TRAINERS ? dt__ckpt_writers[trainer] : "an unknown trainer",
                            k->fn, dt__ckpt_writers[k->trainer]);
    for (i = 1; world != (uint64_t)k->world && dt__ckpt_elastic(k->trainer) == DT__ELASTIC_MEAN && i < world; i++)   /* to mix them, alike */
        if (dt__get_le64(file + 32 + 8 * i) != dt__get_le64(file + 32))
            return dt_set_error(DT_ERR_FORMAT, "%s: %s holds sections of different sizes for its %llu ranks, which a run on %d "
                                "ranks cannot share out: resume on %llu ranks", k->fn, k->path, (unsigned long long)world,
                                k->world, (unsigned long long)world);
    sizes[k->world] = (int64_t)world;   /* the world that saved it */
    for (i = 0; i < (uint64_t)k->world; i++)   /* another world: every new rank's section has rank 0's size */
        sizes[i] = (int64_t)dt__get_le64(file + 32 + 8 * (world == (uint64_t)k->world ? i : 0));
    return DT_OK;
}

/* Each rank: its section [len] against its model and optimizer; w receives the section's words. */
static dt_result dt__ckpt_check_section(const dt__ckpt *k, const unsigned char *sec, int64_t len, uint64_t *w) {
    dt_model *m = k->m;
    int64_t nparams, nbuffers;
    int i;
    dt_model_params(m, &nparams);
    dt_model_buffers(m, &nbuffers);
    for (i = 0; i < DT__CKPT_SEC_WORDS; i++) w[i] = dt__get_le64(sec + 8 * i);
    if (w[0] != (uint64_t)(k->saved_world == k->world ? k->rank : 0) || w[4] > (uint64_t)len || w[5] > (uint64_t)len || w[18] > (uint64_t)len ||
        (int64_t)(8 * DT__CKPT_SEC_WORDS + 4 * (w[2] + w[3] + w[4] + w[18]) + 8 * w[5]) != len)
        return dt_set_error(DT_ERR_FORMAT, "%s: rank %d: its section of %s is damaged (impossible sizes)", k->fn, k->rank, k->path);
    if (w[2] != (uint64_t)nparams || w[3] != (uint64_t)nbuffers || w[1] != dt__model_signature(m))
        return dt_set_error(DT_ERR_FORMAT, "%s: rank %d: %s holds another model (%llu parameters, %llu buffer values, signature "
                            "%016llx) than this one (%lld, %lld, %016llx): build the same model to load it", k->fn, k->rank,
                            k->path, (unsigned long long)w[2], (unsigned long long)w[3], (unsigned long long)w[1],
                            (long long)nparams, (long long)nbuffers, (unsigned long long)dt__model_signature(m));
    if (k->o && w[5] == 0)
        return dt_set_error(DT_ERR_FORMAT, "%s: rank %d: %s has no optimizer state; pass NULL for the optimizer to load the "
                            "model alone", k->fn, k->rank, k->path);
    if (k->o && (w[6] != (uint64_t)dt__optim_desc(k->o)->kind || w[4] != (uint64_t)dt__ckpt_state(k) ||
                 w[5] != (uint64_t)dt_optim_tensors(k->o)))
        return dt_set_error(DT_ERR_FORMAT, "%s: rank %d: the optimizer state in %s (kind %llu, %llu values) does not fit this "
                            "optimizer (kind %d, %lld values)", k->fn, k->rank, k->path, (unsigned long long)w[6],
                            (unsigned long long)w[4], (int)dt__optim_desc(k->o)->kind, (long long)dt__ckpt_state(k));
    if (w[18] != (uint64_t)k->nextra && !(k->saved_world != k->world && k->rank != 0 && k->nextra == 0))   /* not rank 0's state */
        return dt_set_error(DT_ERR_FORMAT, "%s: rank %d: %s holds %llu values of the trainer's own state (DDP: the compression's "
                            "residual, and PowerSGD's Qs; FedAvg: the server optimizer's m and v; D-PSGD: push-sum's numerators and weight) but this "
                            "run keeps %lld: resume with the settings that wrote it (DDP: the same --compress, with or without error "
                            "feedback; FedAvg: the same --server; D-PSGD: push-sum or not, mixing the buffers or not)", k->fn, k->rank, k->path, (unsigned long long)w[18],
                            (long long)k->nextra);
    return dt__ckpt_check_values(k, sec, (int64_t)(w[2] + w[3] + w[4]), "load");
}

/* Each rank, after every rank's checks passed: its section into its model, optimizer, meta and word (its floats
   turned to the host's order in place first). */
static void dt__ckpt_apply(dt__ckpt *k, unsigned char *sec, const uint64_t *w, dt_checkpoint_meta *meta) {
    void *ctx;
    const dt_ops *ops = dt__model_ops(k->m, &ctx);
    int64_t nparams, nbuffers;
    float *params = dt_model_params(k->m, &nparams), *buffers = dt_model_buffers(k->m, &nbuffers);
    const unsigned char *p = sec + 8 * DT__CKPT_SEC_WORDS;
    uint32_t lr = (uint32_t)w[7];
    int64_t i;
    int j;
    uint64_t rng[3] = {w[8], w[9], w[10]};   /* seed, stream, step */
    dt__ckpt_floats_order(sec, w);
    ops->upload(ctx, params, p, 4 * nparams);
    p += 4 * nparams;
    if (nbuffers) ops->upload(ctx, buffers, p, 4 * nbuffers);
    p += 4 * nbuffers;
    if (k->saved_world != k->world) {   /* another world's rank 0: this rank's own dropout stream */
        uint64_t own[3];
        dt__model_get_rng(k->m, own);
        rng[1] = own[1];
    }
    dt__model_set_rng(k->m, rng);
    if (k->o) {
        int64_t *steps = dt__optim_steps(k->o);
        if (w[4]) ops->upload(ctx, dt_optim_state(k->o, NULL), p, 4 * (int64_t)w[4]);
        for (i = 0; i < dt_optim_tensors(k->o); i++) steps[i] = (int64_t)dt__get_le64(p + 4 * (int64_t)w[4] + 8 * i);
        memcpy(&dt__optim_desc(k->o)->lr, &lr, sizeof lr);
    }
    p += 4 * (int64_t)w[4] + 8 * (int64_t)w[5];   /* the optimizer's part, loaded or not: the trainer's floats follow */
    if (k->nextra) memcpy(k->extra, p, 4 * (size_t)k->nextra);
    if (meta) {
        meta->epoch = (int64_t)w[11]; meta->step = (int64_t)w[12]; meta->round = (int64_t)w[13];
        meta->batch = (int64_t)w[14]; meta->rng.state = w[15]; meta->rng.inc = w[16];
        for (j = 0; j < DT_CHECKPOINT_VALUES; j++) memcpy(&meta->values[j], &w[19 + j], sizeof(double));
    }
    k->word = (int64_t)w[17];
}

/* Collective (or one process with k->c NULL): rank 0 reads and checks the file and hands each rank its
   section; each rank checks its own; only when every check passed on every rank does any rank change. */
static dt_result dt__ckpt_load(dt__ckpt *k, dt_checkpoint_meta *meta) {
    int64_t *sizes = (int64_t *)DT_MALLOC(sizeof(int64_t) * (size_t)(k->world + 1)), bytes = 0, most = 0, i, off;
    unsigned char *file = NULL, *slots = NULL, *sec = NULL;
    uint64_t w[DT__CKPT_SEC_WORDS];
    int packed = 0;
    dt_result r = DT_OK;
    if (!sizes) r = dt_set_error(DT_ERR_OUT_OF_MEMORY, "%s: rank %d: no memory", k->fn, k->rank);
    else if (k->rank == 0 && (r = dt__ckpt_read_file(k, &file, &bytes)) == DT_OK) r = dt__ckpt_check_file(k, file, bytes, sizes);
    if ((r = dt__ckpt_agree(k, r)) != DT_OK) goto done;
    if (k->c && k->world > 1 && (r = dt_comm_broadcast(k->c, sizes, (size_t)k->world + 1, DT_I64, 0, DT_ALGO_AUTO)) != DT_OK)
        goto done;
    k->saved_world = (int)sizes[k->world];
    if (k->saved_world != k->world && k->rank == 0)
        dt_log(DT_LOG_INFO, "%s: %s was saved by %d ranks; this run has %d, and each starts from %s", k->fn, k->path,
               k->saved_world, k->world, dt__ckpt_elastic(k->trainer) == DT__ELASTIC_RANK0 ? "rank 0's state (the global model)"
               : "the mean of theirs (parameters, buffers, optimizer state)");
    for (i = 0; i < k->world; i++) most = sizes[i] > most ? sizes[i] : most;
    if (k->rank == 0 && k->saved_world != k->world) {   /* another world: the sections the new ranks take */
        if ((slots = (unsigned char *)DT_MALLOC((size_t)(most * k->world))) != NULL)
            dt__ckpt_remap(k, file + 8 + 8 * (DT__CKPT_HEAD_WORDS + k->saved_world), k->saved_world, most, slots,
                           meta ? meta->sum_values : 0u);
        packed = 1;
    } else if (k->rank == 0) {   /* the sections as slots of the largest one's size: in place when they are equal */
        slots = file + 8 + 8 * (DT__CKPT_HEAD_WORDS + k->world);
        for (i = 0; i < k->world; i++) packed |= sizes[i] != most;
        if (packed && (slots = (unsigned char *)DT_MALLOC((size_t)(most * k->world))) != NULL)
            for (i = 0, off = 8 + 8 * (DT__CKPT_HEAD_WORDS + k->world); i < k->world; off += sizes[i], i++)
                memcpy(slots + i * most, file + off, (size_t)sizes[i]);
    }
    sec = (unsigned char *)DT_MALLOC((size_t)most);
    if (!sec || (k->rank == 0 && !slots))
        r = dt_set_error(DT_ERR_OUT_OF_MEMORY, "%s: rank %d: no memory to stage %lld bytes of checkpoint", k->fn, k->rank,
                         (long long)most);
    if ((r = dt__ckpt_agree(k, r)) != DT_OK) goto done;
    if (k->c && k->world > 1) r = dt_comm_scatter(k->c, slots, sec, (size_t)most, DT_U8, 0);
    else memcpy(sec, slots, (size_t)most);
    if (r == DT_OK) r = dt__ckpt_check_section(k, sec, sizes[k->rank], w);
    if ((r = dt__ckpt_agree(k, r)) == DT_OK) dt__ckpt_apply(k, sec, w, meta);   /* everything checked everywhere */
done:
    if (packed) DT_FREE(slots);
    DT_FREE(sizes); DT_FREE(file); DT_FREE(sec);
    return r;
}

/* Fills the call's description; refuses what no rank can save or load. */
static dt_result dt__ckpt_init(dt__ckpt *k, dt_comm *c, const char *fn, int trainer, const char *path, dt_model *m,
                               dt_optim *o) {
    dt_result r;
    memset(k, 0, sizeof *k);
    k->c = c; k->fn = fn; k->trainer = trainer; k->path = path; k->m = m; k->o = o;
    k->rank = c ? dt_comm_rank(c) : 0;
    k->world = c ? dt_comm_size(c) : 1;
    if ((r = dt__need_final(m, fn)) != DT_OK) return r;
    if (!path || !*path) return dt_set_error(DT_ERR_INVALID_ARG, "%s: path is empty", fn);
    if (o && dt__optim_model(o) != m) return dt_set_error(DT_ERR_INVALID_ARG, "%s: the optimizer belongs to another model", fn);
    if (dt__host_big_endian() != DT__BIG_ENDIAN)
        return dt_set_error(DT_ERR_UNSUPPORTED, "%s: this compiler does not say the host's byte order (__BYTE_ORDER__), which "
                            "the file's little-endian numbers need: build with GCC or Clang", fn);
    return DT_OK;
}

dt_result dt_checkpoint_save(const char *path, dt_model *m, dt_optim *o, const dt_checkpoint_meta *meta) {
    dt__ckpt k;
    dt_result r = dt__ckpt_init(&k, NULL, "dt_checkpoint_save", DT__CKPT_PLAIN, path, m, o);
    return r != DT_OK ? r : dt__ckpt_save(&k, meta);
}

dt_result dt_checkpoint_load(const char *path, dt_model *m, dt_optim *o, dt_checkpoint_meta *meta) {
    dt__ckpt k;
    dt_result r = dt__ckpt_init(&k, NULL, "dt_checkpoint_load", DT__CKPT_PLAIN, path, m, o);
    return r != DT_OK ? r : dt__ckpt_load(&k, meta);
}

/* The collective entry points: each rank's refusal of its own arguments is agreed like any other failure, so
   no rank waits in a collective that another never enters. */
static dt_result dt__ckpt_save_extra(dt_comm *c, const char *fn, int trainer, const char *path, dt_model *m, dt_optim *o,
                                     const dt_checkpoint_meta *meta, int64_t word, float *extra, int64_t nextra, dt_result pre) {
    dt__ckpt k;
    dt_result r = dt__ckpt_init(&k, c, fn, trainer, path, m, o);
    if (!c) return dt_set_error(DT_ERR_INVALID_ARG, "%s: the communicator is NULL", fn);
    k.word = word;
    k.extra = extra;
    k.nextra = nextra;
    if ((r = dt__ckpt_agree(&k, pre != DT_OK ? pre : r)) != DT_OK) return r;
    return dt__ckpt_save(&k, meta);
}
static dt_result dt__ckpt_save_comm(dt_comm *c, const char *fn, int trainer, const char *path, dt_model *m, dt_optim *o,
                                    const dt_checkpoint_meta *meta, int64_t word, dt_result pre) {
    return dt__ckpt_save_extra(c, fn, trainer, path, m, o, meta, word, NULL, 0, pre);
}
static dt_result dt__ckpt_load_extra(dt_comm *c, const char *fn, int trainer, const char *path, dt_model *m, dt_optim *o,
                                     dt_checkpoint_meta *meta, int64_t *word, float *extra, int64_t nextra, dt_result pre) {
    dt__ckpt k;
    dt_result r = dt__ckpt_init(&k, c, fn, trainer, path, m, o);
    if (!c) return dt_set_error(DT_ERR_INVALID_ARG, "%s: the communicator is NULL", fn);
    k.extra = extra;
    k.nextra = nextra;
    if ((r = dt__ckpt_agree(&k, pre != DT_OK ? pre : r)) != DT_OK || (r = dt__ckpt_load(&k, meta)) != DT_OK) return r;
    if (word) *word = k.word;
    return DT_OK;
}
static dt_result dt__ckpt_load_comm(dt_comm *c, const char *fn, int trainer, const char *path, dt_model *m, dt_optim *o,
                                    dt_checkpoint_meta *meta, int64_t *word, dt_result pre) {
    return dt__ckpt_load_extra(c, fn, trainer, path, m, o, meta, word, NULL, 0, pre);
}

dt_result dt_checkpoint_save_comm(dt_comm *c, const char *path, dt_model *m, dt_optim *o, const dt_checkpoint_meta *meta) {
    return dt__ckpt_save_comm(c, "dt_checkpoint_save_comm", DT__CKPT_PLAIN, path, m, o, meta, 0, DT_OK);
}
dt_result dt_checkpoint_load_comm(dt_comm *c, const char *path, dt_model *m, dt_optim *o, dt_checkpoint_meta *meta) {
    return dt__ckpt_load_comm(c, "dt_checkpoint_load_comm", DT__CKPT_PLAIN, path, m, o, meta, NULL, DT_OK);
}

/* ---- shared by the trainers -------------------------------------------------------------------- */

/* The checks every trainer's create and dt_hogwild_run (and Hogwild's pull and push) start with, so that they
   refuse the same things alike: a NULL out, communicator (when the trainer has one: has_comm) or model is
   DT_ERR_INVALID_ARG, a model that is not finalized DT_ERR_STATE. `model` names it in the message ("the
   model", "the replica"). A NULL desc is no error: every create reads it as a zeroed desc. */
static dt_result dt__trainer_check(const char *fn, int has_out, int has_comm, const dt_comm *c, const dt_model *m,
                                   const char *model) {
    char at[32] = "";   /* "rank 3: " */
    if (has_comm && c) snprintf(at, sizeof at, "rank %d: ", dt_comm_rank(c));
    if (!has_out) return dt_set_error(DT_ERR_INVALID_ARG, "%s: out is NULL", fn);
    if (has_comm && !c) return dt_set_error(DT_ERR_INVALID_ARG, "%s: the communicator is NULL", fn);
    if (!m) return dt_set_error(DT_ERR_INVALID_ARG, "%s: %s%s is NULL", fn, at, model);
    if (!dt__model_finalized(m))
        return dt_set_error(DT_ERR_STATE, "%s: %s%s is not finalized: call dt_model_finalize after building it", fn, at, model);
    return DT_OK;
}

/* Collective, for every trainer's create: one all-reduce with MAX of {n, -n, world - rank if pre failed}: the
   ranks agree on pre, what this rank's create found before (a bad desc, no memory), so that a rank that failed
   never leaves the others waiting in the next collective until the timeout: every rank returns, a failed one
   its own error, the others the lowest failing rank's (dt__agree_tell); then that all ranks built a model of the
   same size (n and -n come back unchanged only when every n is equal); then, with broadcast set, every rank gets
   rank 0's parameters and buffers so the replicas start equal. */
static dt_result dt__same_model(dt_comm *c, dt_model *m, const char *fn, int broadcast, dt_result pre) {
    int64_t np = 0, nb = 0, n, v[3];
    float *p = dt_model_params(m, &np), *b = dt_model_buffers(m, &nb);
    dt_result r;
    int world = dt_comm_size(c);
    n = np + nb;
    v[0] = n;
    v[1] = -n;
    v[2] = pre != DT_OK ? world - dt_comm_rank(c) : 0;   /* the lowest failing rank, as world - rank under MAX */
    if (world == 1) return pre;
    if ((r = dt_comm_allreduce(c, v, 3, DT_I64, DT_MAX, DT_ALGO_AUTO)) != DT_OK) return r;
    if (v[2] > 0) return dt__agree_tell(c, pre, (int)(world - v[2]), 1);   /* a failed rank keeps its own message */
    if (v[0] != n || -v[1] != n)
        return dt_set_error(DT_ERR_MISMATCH, "%s: rank %d: its model has %lld parameters and buffers but another rank's has %lld: "
                            "every rank must build the same model", fn, dt_comm_rank(c), (long long)n, (long long)(v[0] != n ? v[0] : -v[1]));
    if (!broadcast) return DT_OK;
    if ((r = dt_comm_broadcast(c, p, (size_t)np, DT_F32, 0, DT_ALGO_AUTO)) != DT_OK) return r;
    return nb > 0 ? dt_comm_broadcast(c, b, (size_t)nb, DT_F32, 0, DT_ALGO_AUTO) : DT_OK;
}

/* The rule for every number that crossed ranks and that a decision divides by or counts with (DDP's sample and
   rank counts, PowerSGD's column norms, FedAvg's client reports): it must be finite and in [lo, hi], else
   DT_ERR_NUMERIC naming fn, the rank, what and the value. After an all-reduce every rank holds the same bits,
   so every rank stops at the same check; a NaN there comes from a rank that sent one (a diverged replica, a
   corrupt message, DT_FAULT kind=nan) and would otherwise scale a whole step silently. */
static dt_result dt__reduced_check(const dt_comm *c, const char *fn, const char *what, double v, double lo, double hi) {
    if (v >= lo && v <= hi) return DT_OK;   /* false for a NaN */
    return dt_set_error(DT_ERR_NUMERIC, "%s: rank %d: %s is %g, not a finite number in [%g, %g]: a rank sent a NaN, an infinity or "
                        "a wrong count (a diverged replica, a corrupt message, or DT_FAULT kind=nan); the step is not applied",
                        fn, dt_comm_rank(c), what, v, lo, hi);
}

#ifdef __cplusplus
}
#endif
#endif /* the implementation */
