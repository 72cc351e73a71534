/* dt_test_trace.h - for the timeline's tests (tests/test_trace.c, tests/mpi/test_trace_mpi.c): a rank
   function that trains a few steps with DDP or D-PSGD inside spans of its own, and the reading back of the
   trace file (the Chrome trace event format dt_launch writes with --trace): a small JSON parser that checks
   the whole file and keeps each event's name, category, phase, process (rank), thread (lane), time,
   duration and a few arguments; queries over the events; and the check that the spans of every lane nest.
   Include dtrain.h first. */
#ifndef DT_TEST_TRACE_H
#define DT_TEST_TRACE_H
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dt_test.h"

/* ---- a few training steps on a rank ---------------------------------------------------------------- */

#define TRACE_ODD_NAME "say \"hi\" \\ to\ttabs\nand lines"   /* a span name JSON must escape */
#define TRACE_MAXR 8
typedef struct trace_job {
    int     dpsgd;         /* 0: DDP (buckets of 4 KiB: three for the MLP), 1: D-PSGD on a ring */
    int     steps, batch, fail_rank;   /* fail_rank fails before its first step (-1: none) */
    int64_t in;            /* input features of the MLP (784-512-256-10 but for the input) */
    int     enabled[TRACE_MAXR], overlapped[TRACE_MAXR], buckets[TRACE_MAXR];   /* what each rank saw */
} trace_job;

/* Steps inside a span named TRACE_ODD_NAME, each inside a span "step", then an instant "marker"; the
   DDP's join after. The rank's own data: batch random samples. */
static DT_T_UNUSED dt_result trace_train_rank(dt_comm *c, void *arg) {
    trace_job *j = (trace_job *)arg;
    int me = dt_comm_rank(c), s;
    dt_model *m = NULL;
    dt_optim *o = NULL;
    dt_ddp *d = NULL;
    dt_dpsgd *g = NULL;
    dt_topology topo;
    dt_topology_desc td;
    dt_model_desc md;
    dt_optim_desc od;
    dt_ddp_desc dd;
    dt_rng rng;
    float loss, *x = (float *)malloc(sizeof(float) * (size_t)(j->batch * j->in));
    int32_t *y = (int32_t *)malloc(sizeof(int32_t) * (size_t)j->batch);
    dt_result r = x && y ? DT_OK : DT_ERR_OUT_OF_MEMORY;
    memset(&topo, 0, sizeof topo);
    memset(&td, 0, sizeof td);
    memset(&md, 0, sizeof md);
    memset(&od, 0, sizeof od);
    memset(&dd, 0, sizeof dd);
    td.world = dt_comm_size(c);
    md.in_c = j->in; md.seed = 7;
    od.lr = 0.01f;
    dd.bucket_bytes = 4096;
    dt_rng_init(&rng, 11, (uint64_t)me);
    for (s = 0; r == DT_OK && s < j->batch * j->in; s++) x[s] = dt_rng_uniform(&rng) - 0.5f;
    for (s = 0; r == DT_OK && s < j->batch; s++) y[s] = (int32_t)dt_rng_below(&rng, 10);
    if (me < TRACE_MAXR) j->enabled[me] = dt_trace_enabled();
#define TRY_(call) do { if ((r = (call)) != DT_OK) goto done; } while (0)
    if (r != DT_OK) goto done;
    TRY_(dt_zoo_create(&m, DT_ZOO_MLP, 10, &md));
    TRY_(dt_optim_create(&o, m, &od));
    if (j->dpsgd) {
        TRY_(dt_topology_create(&topo, &td));
        TRY_(dt_dpsgd_create(&g, c, m, &topo, NULL));
    } else {
        TRY_(dt_ddp_create(&d, c, m, &dd));
        if (me < TRACE_MAXR) { j->overlapped[me] = dt_ddp_overlapped(d); j->buckets[me] = dt_ddp_buckets(d); }
    }
    dt_trace_begin(TRACE_ODD_NAME, "user");
    for (s = 0; s < j->steps && r == DT_OK; s++) {
        if (me == j->fail_rank) { r = dt_set_error(DT_ERR_STATE, "rank %d fails on purpose", me); break; }
        dt_trace_begin("step", "user");
        if ((r = dt_model_forward(m, x, j->batch)) == DT_OK && (r = dt_model_loss_labels(m, y, &loss)) == DT_OK)
            r = j->dpsgd ? dt_model_backward(m, NULL) : dt_ddp_backward(d, NULL, j->batch, 1);
        if (r == DT_OK) r = j->dpsgd ? dt_dpsgd_step(g, o) : dt_optim_step(o);
        dt_model_zero_grad(m);
        dt_trace_end();
    }
    dt_trace_instant("marker", "user");
    dt_trace_end();
    if (r == DT_OK && d) r = dt_ddp_join(d, o);
done:
#undef TRY_
    dt_ddp_destroy(d);
    dt_dpsgd_destroy(g);
    dt_topology_free(&topo);
    dt_optim_destroy(o);
    dt_model_destroy(m);
    free(x);
    free(y);
    return r;
}

/* ---- the file, read back --------------------------------------------------------------------------- */

/* ---- a trace file, read back --------------------------------------------------------------------- */

typedef struct ev {
    char   name[64], cat[32], ph[4], aname[64];   /* aname: args.name or args.labels (metadata events) */
    int    pid, tid, unfinished, has_ts, has_dur;
    double ts, dur;                               /* microseconds */
} ev;
typedef struct trace {
    ev    *e;
    int    n, cap;
    double dropped, events, ranks;                /* otherData */
} trace;

typedef struct jp { const char *s; size_t i, n; int err; } jp;
static DT_T_UNUSED void jp_ws(jp *p) {
    while (p->i < p->n && (p->s[p->i] == ' ' || p->s[p->i] == '\t' || p->s[p->i] == '\r' || p->s[p->i] == '\n')) p->i++;
}
static DT_T_UNUSED int jp_lit(jp *p, char c) {
    jp_ws(p);
    if (p->i < p->n && p->s[p->i] == c) { p->i++; return 1; }
    return 0;
}
/* A JSON string into out[cap] (out may be NULL); escapes decoded, \u above 0x7f as '?'. */
static DT_T_UNUSED void jp_string(jp *p, char *out, size_t cap) {
    size_t k = 0;
    if (!jp_lit(p, '"')) { p->err = 1; return; }
    while (p->i < p->n && p->s[p->i] != '"') {
        char c = p->s[p->i++];
        if ((unsigned char)c < 0x20) { p->err = 1; return; }
        if (c == '\\') {
            unsigned v;
            if (p->i >= p->n) { p->err = 1; return; }
            switch (c = p->s[p->i++]) {
            case '"': case '\\': case '/': break;
            case 'n': c = '\n'; break;
            case 't': c = '\t'; break;
            case 'r': c = '\r'; break;
            case 'b': c = '\b'; break;
            case 'f': c = '\f'; break;
            case 'u':
                if (p->i + 4 > p->n || sscanf(p->s + p->i, "%4x", &v) != 1) { p->err = 1; return; }
                p->i += 4;
                c = v < 0x80 ? (char)v : '?';
                break;
            default: p->err = 1; return;
            }
        }
        if (out && k + 1 < cap) out[k++] = c;
    }
    if (p->i >= p->n) { p->err = 1; return; }
    p->i++;
    if (out) out[k] = 0;
}
static DT_T_UNUSED double jp_number(jp *p) {
    char *end;
    double v;
    jp_ws(p);
    if (p->i >= p->n || !(p->s[p->i] == '-' || (p->s[p->i] >= '0' && p->s[p->i] <= '9'))) { p->err = 1; return 0; }
    v = strtod(p->s + p->i, &end);
    p->i = (size_t)(end - p->s);
    return v;
}
typedef void (*jp_member_fn)(jp *p, const char *key, void *ctx);
static DT_T_UNUSED void jp_value(jp *p, int depth);
static DT_T_UNUSED void jp_skip_member(jp *p, const char *key, void *ctx) { (void)key; jp_value(p, *(int *)ctx + 1); }
/* An object: fn parses the value of each member. */
static DT_T_UNUSED void jp_object(jp *p, jp_member_fn fn, void *ctx) {
    char key[64];
    if (!jp_lit(p, '{')) { p->err = 1; return; }
    if (jp_lit(p, '}')) return;
    do {
        jp_string(p, key, sizeof key);
        if (p->err || !jp_lit(p, ':')) { p->err = 1; return; }
        fn(p, key, ctx);
    } while (!p->err && jp_lit(p, ','));
    if (!jp_lit(p, '}')) p->err = 1;
}
/* Any value, checked and skipped. */
static DT_T_UNUSED void jp_value(jp *p, int depth) {
    jp_ws(p);
    if (depth > 64 || p->i >= p->n) { p->err = 1; return; }
    switch (p->s[p->i]) {
    case '{': jp_object(p, jp_skip_member, &depth); return;
    case '[':
        p->i++;
        if (jp_lit(p, ']')) return;
        do jp_value(p, depth + 1); while (!p->err && jp_lit(p, ','));
        if (!jp_lit(p, ']')) p->err = 1;
        return;
    case '"': jp_string(p, NULL, 0); return;
    case 't': case 'f': case 'n': {
        const char *w = p->s[p->i] == 't' ? "true" : p->s[p->i] == 'f' ? "false" : "null";
        if (strncmp(p->s + p->i, w, strlen(w)) != 0) p->err = 1;
        p->i += strlen(w);
        return;
    }
    default: (void)jp_number(p); return;
    }
}
static DT_T_UNUSED void jp_arg(jp *p, const char *key, void *ctx) {
    ev *e = (ev *)ctx;
    if (!strcmp(key, "name") || !strcmp(key, "labels")) jp_string(p, e->aname, sizeof e->aname);
    else if (!strcmp(key, "unfinished")) e->unfinished = jp_number(p) != 0.0;
    else jp_value(p, 1);
}
static DT_T_UNUSED void jp_event_member(jp *p, const char *key, void *ctx) {
    ev *e = (ev *)ctx;
    if (!strcmp(key, "name")) jp_string(p, e->name, sizeof e->name);
    else if (!strcmp(key, "cat")) jp_string(p, e->cat, sizeof e->cat);
    else if (!strcmp(key, "ph")) jp_string(p, e->ph, sizeof e->ph);
    else if (!strcmp(key, "pid")) e->pid = (int)jp_number(p);
    else if (!strcmp(key, "tid")) e->tid = (int)jp_number(p);
    else if (!strcmp(key, "ts")) { e->ts = jp_number(p); e->has_ts = 1; }
    else if (!strcmp(key, "dur")) { e->dur = jp_number(p); e->has_dur = 1; }
    else if (!strcmp(key, "args")) jp_object(p, jp_arg, e);
    else jp_value(p, 1);
}
static DT_T_UNUSED void jp_other(jp *p, const char *key, void *ctx) {
    trace *t = (trace *)ctx;
    if (!strcmp(key, "dropped_events")) t->dropped = jp_number(p);
    else if (!strcmp(key, "events")) t->events = jp_number(p);
    else if (!strcmp(key, "ranks")) t->ranks = jp_number(p);
    else jp_value(p, 1);
}
static DT_T_UNUSED void jp_top(jp *p, const char *key, void *ctx) {
    trace *t = (trace *)ctx;
    if (!strcmp(key, "otherData")) { jp_object(p, jp_other, t); return; }
    if (strcmp(key, "traceEvents") != 0) { jp_value(p, 1); return; }
    if (!jp_lit(p, '[')) { p->err = 1; return; }
    if (jp_lit(p, ']')) return;
    do {
        if (t->n == t->cap) {
            ev *q = (ev *)realloc(t->e, sizeof *q * (size_t)(t->cap = t->cap ? 2 * t->cap : 256));
            if (!q) { p->err = 1; return; }
            t->e = q;
        }
        memset(&t->e[t->n], 0, sizeof t->e[0]);
        jp_object(p, jp_event_member, &t->e[t->n++]);
    } while (!p->err && jp_lit(p, ','));
    if (!jp_lit(p, ']')) p->err = 1;
}

/* Reads and parses path: 0 when it is one valid JSON object with a traceEvents array. */
static DT_T_UNUSED int trace_load(const char *path, trace *t) {
    FILE *f = fopen(path, "rb");
    char *buf;
    long len;
    jp p;
    memset(t, 0, sizeof *t);
    t->dropped = -1;
    if (!f) { printf("    cannot open %s\n", path); return -1; }
    fseek(f, 0, SEEK_END);
    len = ftell(f);
    fseek(f, 0, SEEK_SET);
    buf = (char *)malloc((size_t)len + 1);
    if (!buf || fread(buf, 1, (size_t)len, f) != (size_t)len) { fclose(f); free(buf); return -1; }
    fclose(f);
    buf[len] = 0;
    p.s = buf; p.i = 0; p.n = (size_t)len; p.err = 0;
    if (strncmp(buf, "{\"traceEvents\":[", 16) != 0) p.err = 1;
    jp_object(&p, jp_top, t);
    jp_ws(&p);
    if (p.i != p.n) p.err = 1;
    if (p.err) printf("    %s: not valid JSON near byte %zu\n", path, p.i);
    free(buf);
    return p.err ? -1 : 0;
}
static DT_T_UNUSED int file_exists(const char *path) {
    FILE *f = fopen(path, "rb");
    if (f) fclose(f);
    return f != NULL;
}
static DT_T_UNUSED void trace_free(trace *t) { free(t->e); memset(t, 0, sizeof *t); }

/* Spans (or instants, ph "i") called name on rank pid, lane tid (-1: any lane). */
static DT_T_UNUSED int count(const trace *t, const char *ph, int pid, int tid, const char *name) {
    int i, k = 0;
    for (i = 0; i < t->n; i++)
        k += !strcmp(t->e[i].ph, ph) && t->e[i].pid == pid && (tid < 0 || t->e[i].tid == tid) && !strcmp(t->e[i].name, name);
    return k;
}
/* The metadata event `what` (process_name, thread_name) of pid/tid with args.name == value. */
static DT_T_UNUSED int has_meta(const trace *t, const char *what, int pid, int tid, const char *value) {
    int i;
    for (i = 0; i < t->n; i++)
        if (!strcmp(t->e[i].ph, "M") && !strcmp(t->e[i].name, what) && t->e[i].pid == pid && t->e[i].tid == tid &&
            !strcmp(t->e[i].aname, value)) return 1;
    return 0;
}

#define EPS 0.01   /* microseconds: ts and dur are written to 0.001 */
/* Every lane: spans in begin order with non-decreasing ts and dur >= 0, each inside the span open around
   it (a child ends before its parent), and ended (unless unfinished_ok: a failed run's). Returns the
   violations. */
static DT_T_UNUSED int check_lanes(const trace *t, int unfinished_ok) {
    int pid, tid, i, bad = 0;
    for (pid = 0; pid < 8; pid++)
        for (tid = 0; tid < 2; tid++) {
            double prev = -1.0, stack[64];
            int depth = 0;
            for (i = 0; i < t->n; i++) {
                const ev *e = &t->e[i];
                if (e->pid != pid || e->tid != tid || strcmp(e->ph, "X") != 0) continue;
                if (!e->has_ts || !e->has_dur || e->dur < 0.0 || e->ts < prev - EPS || (e->unfinished && !unfinished_ok)) {
                    if (bad++ < 5) printf("    rank %d lane %d: span %s at %.3f (dur %.3f%s) after %.3f\n", pid, tid, e->name, e->ts,
                                          e->dur, e->unfinished ? ", unfinished" : "", prev);
                    continue;
                }
                prev = e->ts;
                while (depth > 0 && stack[depth - 1] <= e->ts + EPS) depth--;
                if (depth > 0 && e->ts + e->dur > stack[depth - 1] + EPS) {
                    if (bad++ < 5) printf("    rank %d lane %d: span %s [%.3f, %.3f] ends after its parent (%.3f)\n", pid, tid, e->name,
                                          e->ts, e->ts + e->dur, stack[depth - 1]);
                }
                if (depth < 64) stack[depth++] = e->ts + e->dur;
            }
        }
    return bad;
}
#endif
