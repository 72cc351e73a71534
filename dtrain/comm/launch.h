/* dtrain/comm/launch.h - the launcher: ranks as threads or processes, its flags, the timeline file.
   Part of dtrain v0.1.0, MIT license (see the end of dtrain.h, which is the manual and the one include).

   WHAT IS HERE
     dt_launch (--ranks N threads on the local backend, one rank: self; one rank per process under
     mpiexec through the launcher a backend registers: dtrain_mpi.h's when built with DT_USE_MPI), the
     end of a run in bounded time and its cause logged once, dt_launch_parse (the launcher's flags out of
     argv), dt_launch_rank (a backend's launcher runs its one rank through it), and the timeline file
     (Chrome trace JSON: every rank's events, gathered on rank 0 under MPI).
   USES
     dtrain/comm/local.h (the local ranks) and what it includes.
   READ FIRST
     dt_launch, dt__launch_local, dt__rank_main; then dt_launch_rank and dt__launch_trace_finish.
*/
#ifndef DTRAIN_LAUNCH_H
#define DTRAIN_LAUNCH_H
#include "local.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A rank's work: its communicator and the argument given to dt_launch. Returning an error stops the
   run: the other ranks' waits for this one fail with DT_ERR_PEER. */
typedef dt_result (*dt_rank_fn)(dt_comm *comm, void *arg);

typedef struct dt_launch_desc {
    int          ranks;            /* local ranks (threads); 0 = 1. Ignored under mpiexec */
    int          threads_per_rank; /* OpenMP threads of each rank: 0 = cores / ranks, at least 1 */
    int          log_all_ranks;    /* show ranks > 0's info lines too (always shown: warnings, errors) */
    dt_comm_desc comm;
    const char  *trace_path;       /* write a timeline of every rank here (Chrome trace JSON); NULL = off */
    int64_t      trace_max_events; /* events kept per rank and lane; later ones are dropped and counted
                                      (0 = DT_TRACE_MAX_EVENTS) */
} dt_launch_desc;

#define DT_TRACE_MAX_EVENTS (1 << 19)   /* about 60 MB per lane at most, allocated as events come */

/* Takes the launcher's flags out of argv (argc updated), leaving the program's own:
     --ranks N            local ranks (threads in this process)
     --algo A             default collective algorithm: naive, ring, tree, native, hier
     --node-size N        ranks per node (DT_ALGO_HIER, the link model); default: the backend's grouping
     --timeout S          seconds a rank may wait for another before the run fails
     --link-latency S     link model: seconds per message (local ranks)
     --link-bandwidth B   link model: bytes per second per link, with suffix K, M or G (local ranks)
     --threads-per-rank T OpenMP threads per rank
     --log-all-ranks      show every rank's log lines, prefixed "[rank r]"
     --trace PATH         write a timeline of every rank's compute and communication to PATH (Chrome
                          trace JSON, for https://ui.perfetto.dev or chrome://tracing)
     --trace-max-events N events kept per rank and thread (default DT_TRACE_MAX_EVENTS)
   Returns DT_ERR_INVALID_ARG naming a bad value. */
dt_result dt_launch_parse(int *argc, char **argv, dt_launch_desc *d);

/* Runs fn on every rank and returns DT_OK when every rank returned DT_OK, else, after logging the failure,
   the cause's result (a failure other than DT_ERR_PEER, which only follows from another rank's), its
   message, naming the rank, in dt_last_error(); under MPI, this process's rank's. The cause is logged
   once: ranks that failed the same way are named on one line (local ranks) or say nothing (MPI), and
   DT_ERR_PEER is logged at DT_LOG_DEBUG. Every failure ends in bounded time: once a rank has failed the
   others have the communicator's timeout and a second more to end. On local ranks a rank that has not
   is reported as stalled (DT_ERR_TIMEOUT) and its thread left running, so the program must then exit
   without freeing what the ranks use; under MPI the job is ended with MPI_Abort (MPI_Finalize would wait
   for the stalled process). A program's main
   returns `dt_launch(...) == DT_OK ? 0 : 1`: exit status 0, or 1 after a failure. Under mpiexec (built
   with DT_USE_MPI) each process is one rank on MPI_COMM_WORLD (dt_launch_mpi); otherwise desc->ranks
   threads on the local backend (1 rank: the self backend). Log lines of rank r > 0 are prefixed
   "[rank r]" and, unless log_all_ranks, only warnings and errors are shown. With trace_path, the timeline
   is written after the ranks have finished, also when one failed; a trace that cannot be written makes
   the run fail (DT_ERR_IO) with a message naming the path. Under MPI rank 0 gathers every rank's events
   and writes the file; when that fails (a rank has died) each rank writes PATH.rank<r>. */
dt_result dt_launch(const dt_launch_desc *desc, dt_rank_fn fn, void *arg);
/* The same on local ranks without logging, returning each rank's result in results[ranks] (may be NULL)
   and the cause as the return value (the lowest rank's failure of its own, else a stalled rank's, else a
   timeout's, else DT_ERR_PEER), with its message in dt_last_error(). */
dt_result dt_launch_local(const dt_launch_desc *desc, dt_rank_fn fn, void *arg, dt_result *results);
/* The rank of the calling thread inside dt_launch (-1 outside): what the logger prefixes. */
int dt_current_rank(void);

/* For a backend's launcher (backend authors; programs call dt_launch): */
/* Runs fn as this process's one rank on c, for a backend's launcher (dt_launch_mpi): the logger's rank,
   OpenMP threads (desc->threads_per_rank, or the node's cores over local_ranks), the timeline (with
   desc->trace_path: a barrier aligns the clocks; at the end rank 0 gathers every rank's events and writes
   the file, and a rank that cannot take part writes PATH.rank<r>), and a failure announced (dt_comm_leave)
   and left in dt_last_error(), naming the rank, for the backend's launcher to log (dt_launch_mpi logs
   each failure once, not once per rank). Collective over c. Returns fn's result, or the trace's failure. */
dt_result dt_launch_rank(dt_comm *c, const dt_launch_desc *desc, int local_ranks, dt_rank_fn fn, void *arg);

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_LAUNCH_H */

#if defined(DTRAIN_IMPLEMENTATION) && !defined(DTRAIN_LAUNCH_IMPLEMENTATION_DONE)
#define DTRAIN_LAUNCH_IMPLEMENTATION_DONE

#ifdef __cplusplus
extern "C" {
#endif
#include "../core/internal.h"
/* The tag of the timeline's messages under MPI: the library's third (comm/backend.h). */
#define DT__TAG_TRACE (DT__TAG_LIB + 2)

/* ---- the launcher ------------------------------------------------------------------------------ */

int dt_current_rank(void) { return dt__tls_rank; }

static dt_result dt__parse_num(const char *flag, const char *v, double lo, double *out) {
    char *end;
    double x, mul = 1.0;
    if (!v) return dt_set_error(DT_ERR_INVALID_ARG, "%s needs a value", flag);
    x = strtod(v, &end);
    if (end != v && *end && !end[1]) {
        if (*end == 'K' || *end == 'k') { mul = 1e3; end++; }
        else if (*end == 'M' || *end == 'm') { mul = 1e6; end++; }
        else if (*end == 'G' || *end == 'g') { mul = 1e9; end++; }
    }
    if (end == v || *end || !(x * mul >= lo) || x * mul > 1e18)
        return dt_set_error(DT_ERR_INVALID_ARG, "%s '%s' is not a number >= %g", flag, v, lo);
    *out = x * mul;
    return DT_OK;
}

dt_result dt_launch_parse(int *argc, char **argv, dt_launch_desc *d) {
    int i, o = 1;
    if (!argc || !argv || !d) return dt_set_error(DT_ERR_INVALID_ARG, "dt_launch_parse: argc, argv and desc must not be NULL");
    for (i = 1; i < *argc; i++) {
        const char *a = argv[i], *v = i + 1 < *argc ? argv[i + 1] : NULL;
        double x;
        dt_result r = DT_OK;
        if (strcmp(a, "--ranks") == 0) {
            if ((r = dt__parse_num(a, v, 1, &x)) == DT_OK && (x > 4096 || x != (double)(int)x))
                r = dt_set_error(DT_ERR_INVALID_ARG, "--ranks '%s': use a whole number from 1 to 4096", v);
            if (r == DT_OK) d->ranks = (int)x;   /* only a checked value: (int) of 5e9 is undefined */
            i++;
        } else if (strcmp(a, "--threads-per-rank") == 0) {
            if ((r = dt__parse_num(a, v, 1, &x)) == DT_OK && (x > 1024 || x != (double)(int)x))
                r = dt_set_error(DT_ERR_INVALID_ARG, "--threads-per-rank '%s': use a whole number from 1 to 1024", v);
            if (r == DT_OK) d->threads_per_rank = (int)x;
            i++;
        } else if (strcmp(a, "--algo") == 0) {
            if (!v) r = dt_set_error(DT_ERR_INVALID_ARG, "--algo needs a value: naive, ring, tree, native or hier");
            else r = dt_algo_parse(v, &d->comm.algo);
            i++;
        } else if (strcmp(a, "--node-size") == 0) {
            if ((r = dt__parse_num(a, v, 1, &x)) == DT_OK && (x > 1e9 || x != (double)(int)x))
                r = dt_set_error(DT_ERR_INVALID_ARG, "--node-size '%s': use a whole number of ranks per node, from 1", v);
            if (r == DT_OK) d->comm.node_size = (int)x;
            i++;
        } else if (strcmp(a, "--timeout") == 0) {
            if ((r = dt__parse_num(a, v, 1e-3, &x)) == DT_OK) d->comm.timeout = x;
            i++;
        } else if (strcmp(a, "--link-latency") == 0) {
            if ((r = dt__parse_num(a, v, 0, &x)) == DT_OK) d->comm.link_latency = x;
            i++;
        } else if (strcmp(a, "--link-bandwidth") == 0) {
            if ((r = dt__parse_num(a, v, 1, &x)) == DT_OK) d->comm.link_bandwidth = x;
            i++;
        } else if (strcmp(a, "--log-all-ranks") == 0) {
            d->log_all_ranks = 1;
        } else if (strcmp(a, "--trace") == 0) {
            if (!v || !*v) r = dt_set_error(DT_ERR_INVALID_ARG, "--trace needs a file name, e.g. --trace run.json");
            d->trace_path = v; i++;
        } else if (strcmp(a, "--trace-max-events") == 0) {
            if ((r = dt__parse_num(a, v, 1, &x)) == DT_OK && (x > 1e12 || x != (double)(int64_t)x))
                r = dt_set_error(DT_ERR_INVALID_ARG, "--trace-max-events '%s': use a whole number from 1 to 1e12", v);
            if (r == DT_OK) d->trace_max_events = (int64_t)x;
            i++;
        } else {
            argv[o++] = argv[i];
            continue;
        }
        if (r != DT_OK) return r;
    }
    *argc = o;
    argv[o] = NULL;
    return DT_OK;
}

/* ---- the timeline file ------------------------------------------------------------------------ */

/* Lanes for n ranks (rank r's are lanes[r * DT__TRACE_LANES ...]), with time 0 now; NULL without memory. */
static dt__trace_lane *dt__trace_lanes(int n, int64_t max) {
    dt__trace_lane *L = (dt__trace_lane *)DT_MALLOC(sizeof *L * (size_t)n * DT__TRACE_LANES);
    double t0 = dt_time_now();
    int i;
    if (!L) return NULL;
    memset(L, 0, sizeof *L * (size_t)n * DT__TRACE_LANES);
    for (i = 0; i < n * DT__TRACE_LANES; i++) {
        L[i].lane = i % DT__TRACE_LANES;
        L[i].max = max > 0 ? max : DT_TRACE_MAX_EVENTS;
        L[i].origin = t0;
    }
    return L;
}
static void dt__trace_lanes_free(dt__trace_lane *L, int n) {
    int i;
    for (i = 0; L && i < n * DT__TRACE_LANES; i++) DT_FREE(L[i].ev);
    DT_FREE(L);
}

/* Text that grows; oom is set, and nothing more added, once an allocation fails. */
typedef struct dt__text { char *p; size_t n, cap; int oom; } dt__text;
static int dt__text_reserve(dt__text *t, size_t more) {
    size_t cap = t->cap ? t->cap : 4096;
    char *p;
    if (t->oom) return -1;
    if (t->n + more < t->cap) return 0;
    while (cap <= t->n + more) cap *= 2;
    if (!(p = (char *)DT_REALLOC(t->p, cap))) { t->oom = 1; return -1; }
    t->p = p;
    t->cap = cap;
    return 0;
}
static void dt__text_add(dt__text *t, const char *fmt, ...) DT__PRINTF(2, 3);
static void dt__text_add(dt__text *t, const char *fmt, ...) {
    va_list ap;
    int k;
    if (dt__text_reserve(t, 256) != 0) return;
    va_start(ap, fmt);
    k = vsnprintf(t->p + t->n, t->cap - t->n, fmt, ap);
    va_end(ap);
    if (k >= 0 && (size_t)k >= t->cap - t->n && dt__text_reserve(t, (size_t)k + 1) == 0) {   /* did not fit: again */
        va_start(ap, fmt);
        k = vsnprintf(t->p + t->n, t->cap - t->n, fmt, ap);
        va_end(ap);
    }
    if (k < 0) t->oom = 1;
    if (!t->oom) t->n += (size_t)k;
}
/* s as a JSON string: quotes, backslashes and control characters escaped (other bytes as they are: UTF-8). */
static void dt__text_json(dt__text *t, const char *s) {
    static const char hex[] = "0123456789abcdef";
    char *o;
    if (dt__text_reserve(t, 6 * strlen(s) + 3) != 0) return;
    o = t->p + t->n;
    *o++ = '"';
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\') { *o++ = '\\'; *o++ = (char)ch; }
        else if (ch < 0x20) { memcpy(o, "\\u00", 4); o[4] = hex[ch >> 4]; o[5] = hex[ch & 15]; o += 6; }
        else *o++ = (char)ch;
    }
    *o++ = '"';
    *o = 0;
    t->n = (size_t)(o - t->p);
}

/* Appends rank's lanes as trace events (pid = rank, tid = lane), each preceded by ",\n": metadata naming
   the process and its threads, then the events in begin order; spans still open end at `end` (seconds
   since time 0) and say "unfinished". Adds the events to *events and the dropped ones to *dropped. */
static void dt__trace_format(dt__text *t, const dt__trace_lane *lanes, int rank, double end, int64_t *events, int64_t *dropped) {
    static const char *const lane_names[DT__TRACE_LANES] = {"main", "ddp buckets"};
    int64_t i, lost = 0;
    int l, a;
    dt__text_add(t, ",\n{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"args\":{\"name\":\"rank %d\"}}", rank, rank);
    dt__text_add(t, ",\n{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"args\":{\"sort_index\":%d}}", rank, rank);
    for (l = 0; l < DT__TRACE_LANES; l++) {
        const dt__trace_lane *L = &lanes[l];
        lost += L->dropped;
        if (l > 0 && L->n == 0) continue;
        dt__text_add(t, ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"args\":{\"name\":\"%s\"}}", rank, l,
                     lane_names[l]);
        for (i = 0; i < L->n; i++) {
            const dt__trace_ev *e = &L->ev[i];
            int open = e->ph == 'X' && e->t1 < 0;
            dt__text_add(t, ",\n{\"name\":");
            dt__text_json(t, e->name);
            dt__text_add(t, ",\"cat\":");
            dt__text_json(t, e->cat);
            dt__text_add(t, ",\"ph\":\"%c\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f", e->ph, rank, l, 1e6 * e->t0);
            if (e->ph == 'X') dt__text_add(t, ",\"dur\":%.3f", 1e6 * ((open ? end : e->t1) - e->t0));
            else dt__text_add(t, ",\"s\":\"t\"");
            if (e->nargs || open) {
                dt__text_add(t, ",\"args\":{");
                for (a = 0; a < e->nargs; a++) {
                    dt__text_add(t, "%s", a ? "," : "");
                    dt__text_json(t, e->arg[a].key ? e->arg[a].key : "?");
                    if (e->arg[a].s) { dt__text_add(t, ":"); dt__text_json(t, e->arg[a].s); }
                    else dt__text_add(t, ":%lld", (long long)e->arg[a].v);
                }
                if (open) dt__text_add(t, "%s\"unfinished\":1", e->nargs ? "," : "");
                dt__text_add(t, "}");
            }
            dt__text_add(t, "}");
        }
        *events += L->n;
    }
    if (lost)
        dt__text_add(t, ",\n{\"name\":\"process_labels\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"args\":{\"labels\":\"%lld events "
                     "dropped\"}}", rank, (long long)lost);
    *dropped += lost;
}

/* Before a run: that path.tmp can be created (and is removed again), so an unwritable --trace fails at
   once, not after the training it was to record. */
static dt_result dt__trace_check_path(const char *path) {
    char tmp[1024];
    FILE *f;
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp)
        return dt_set_error(DT_ERR_INVALID_ARG, "trace %s: the path is too long", path);
    if (!(f = fopen(tmp, "wb")))
        return dt_set_error(DT_ERR_IO, "cannot write the trace %s: creating %s failed: %s (does the directory exist and is "
                            "it writable?); nothing was run", path, tmp, strerror(errno));
    fclose(f);
    remove(tmp);
    return DT_OK;
}

/* Writes the trace file: the events of body (as dt__trace_format made them) in one JSON object, into
   path.tmp, renamed over path once complete, so a reader never sees half a file. Logs where it went. */
static dt_result dt__trace_write(const char *path, const dt__text *body, int ranks, int64_t events, int64_t dropped, int64_t max) {
    char tmp[1024];
    FILE *f;
    int ok, err;
    if (body->oom) return dt_set_error(DT_ERR_OUT_OF_MEMORY, "trace %s: no memory for the text of %lld events", path, (long long)events);
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp)
        return dt_set_error(DT_ERR_INVALID_ARG, "trace %s: the path is too long", path);
    if (!(f = fopen(tmp, "wb")))
        return dt_set_error(DT_ERR_IO, "cannot write the trace %s: creating %s failed: %s", path, tmp, strerror(errno));
    ok = fputs("{\"traceEvents\":[", f) >= 0 && (body->n < 1 || fwrite(body->p + 1, 1, body->n - 1, f) == body->n - 1) &&
         fprintf(f, "\n],\"displayTimeUnit\":\"ms\",\"otherData\":{\"generator\":\"dtrain %s\",\"ranks\":%d,\"events\":%lld,"
                 "\"dropped_events\":%lld}}\n", DT_VERSION_STRING, ranks, (long long)events, (long long)dropped) > 0;
    err = errno;
    if (fclose(f) != 0 && ok) { ok = 0; err = errno; }
    if (!ok) {
        remove(tmp);
        return dt_set_error(DT_ERR_IO, "cannot write the trace %s: writing %s failed: %s", path, tmp, strerror(err));
    }
    if ((err = dt__file_replace(tmp, path)) != 0) {
        remove(tmp);
        return dt_set_error(DT_ERR_IO, "cannot write the trace %s: renaming %s to it failed: %s", path, tmp, strerror(err));
    }
    dt_log(DT_LOG_INFO, "trace: %s (%lld events, open in https://ui.perfetto.dev or chrome://tracing)", path, (long long)events);
    if (dropped)
        dt_log(DT_LOG_WARN, "trace %s: %lld events were dropped, past %lld per rank and thread; raise the cap with "
               "--trace-max-events N (dt_launch_desc.trace_max_events)", path, (long long)dropped, (long long)max);
    return DT_OK;
}

/* After the local ranks have been joined: every rank's lanes into one file. */
static dt_result dt__trace_finish_local(const char *path, dt__trace_lane *lanes, int n) {
    dt__text t;
    int64_t events = 0, dropped = 0;
    double end = dt_time_now() - lanes[0].origin;
    dt_result r;
    int i;
    memset(&t, 0, sizeof t);
    for (i = 0; i < n; i++) dt__trace_format(&t, lanes + i * DT__TRACE_LANES, i, end, &events, &dropped);
    r = dt__trace_write(path, &t, n, events, dropped, lanes[0].max);
    DT_FREE(t.p);
    return r;
}

/* How the ranks of dt_launch end: counted as they do, and the time of the first failure, after which
   the launcher waits a bounded time for the rest (a rank stalled for good is left behind). */
typedef struct dt__launch_end {
    dt__mutex mu;
    dt__cond  cv;
    int       ended;
    double    failed_at;   /* 0: no rank has failed yet */
} dt__launch_end;

typedef struct dt__rank_ctx {
    dt__launch_end *end;
    int         ended;     /* under end->mu */
    dt_comm    *comm;
    dt_rank_fn  fn;
    void       *arg;
    int         threads, finished, order;
    dt_result   result;
    char        msg[512];
    dt__thread  thread;
    dt__thread_guard guard;  /* calls dt__rank_exit when the thread ends inside fn */
    dt__trace_lane *trace;   /* the rank's lanes when tracing, else NULL */
} dt__rank_ctx;

/* The rank has ended (returned, or its thread exited): the launcher counts it. */
static void dt__rank_ended(dt__rank_ctx *x) {
    dt__mutex_lock(&x->end->mu);
    x->ended = 1;
    x->end->ended++;
    if (x->result != DT_OK && x->end->failed_at == 0) x->end->failed_at = dt_time_now();
    dt__cond_broadcast(&x->end->cv);
    dt__mutex_unlock(&x->end->mu);
}
static void dt__rank_exit(void *p) {   /* the thread ended inside fn (pthread_exit): the rank has gone */
    dt__rank_ctx *x = (dt__rank_ctx *)p;
    if (x->finished) return;
    x->result = DT_ERR_STATE;
    snprintf(x->msg, sizeof x->msg, "DT_ERR_STATE: rank %d: its thread exited before its rank function returned", dt_comm_rank(x->comm));
    dt_comm_leave(x->comm, x->result, x->msg + strlen("DT_ERR_STATE: "));
    dt__rank_ended(x);
}
/* A rank's failure as the launcher reports it: "CODE: rank R: message", the rank added where the
   message does not begin with one (a NaN loss, a file that cannot be read). */
static void dt__rank_msg(char *out, size_t cap, int rank, dt_result r, const char *m) {
    m = dt__cause(m, r);
    if (!m[0]) snprintf(out, cap, "%s: rank %d's function failed", dt_result_str(r), rank);
    else if (strncmp(m, "rank ", 5) == 0) snprintf(out, cap, "%s: %.470s", dt_result_str(r), m);
    else snprintf(out, cap, "%s: rank %d: %.460s", dt_result_str(r), rank, m);
}
static void dt__rank_body(void *p) {
    dt__rank_ctx *x = (dt__rank_ctx *)p;
    x->result = x->fn(x->comm, x->arg);
    if (x->result == DT_OK) x->result = dt__fault_unfired(x->comm);
    if (x->result != DT_OK) dt__rank_msg(x->msg, sizeof x->msg, dt_comm_rank(x->comm), x->result, dt_last_error());
    x->finished = 1;
    dt_comm_leave(x->comm, x->result, dt__cause(x->msg, x->result));   /* without the code's name: the others' reports add it */
}
static void dt__rank_main(void *p) {
    dt__rank_ctx *x = (dt__rank_ctx *)p;
    dt__tls_rank = dt_comm_rank(x->comm);
    dt__tls_trace = x->trace;
#if DT__HAVE_OMP
    omp_set_num_threads(x->threads);
#endif
    dt__thread_guarded(&x->guard, dt__rank_body, dt__rank_exit, x);
    dt__tls_rank = -1;
    dt__tls_trace = NULL;
    dt__rank_ended(x);
}

static int dt__default_threads(int ranks) {
    int cores = 1;
#if DT__HAVE_OMP
    cores = omp_get_num_procs();
#endif
    return cores / ranks > 1 ? cores / ranks : 1;
}

/* How likely rank i's failure is the run's cause: an error of its own, then a rank that never returned
   (stalled), then a timeout (which may only be the wait for a stalled rank), then DT_ERR_PEER (which
   only follows from another rank's failure). */
static int dt__cause_rank(const dt__rank_ctx *x) {
    if (x->result == DT_OK) return -1;
    if (!x->ended) return 2;
    return x->result == DT_ERR_PEER ? 0 : x->result == DT_ERR_TIMEOUT ? 1 : 3;
}

/* Waits for the ranks to end; once one has failed, only grace seconds more (the others' waits end by
   their timeout). Returns how many have not ended: stalled, left running. */
static int dt__launch_wait(dt__launch_end *e, int started, double grace) {
    int left;
    dt__mutex_lock(&e->mu);
    while (e->ended < started) {
        double now = dt_time_now();
        if (e->failed_at > 0 && now >= e->failed_at + grace) break;
        dt__cond_wait_for(&e->cv, &e->mu, e->failed_at > 0 ? e->failed_at + grace - now : 1.0);
    }
    left = started - e->ended;
    dt__mutex_unlock(&e->mu);
    return left;
}

/* Logs the failed ranks: the cause in full; the others' that say the same (every rank's NaN loss) on one
   line; other failures in full; DT_ERR_PEER, which only repeats the cause, at DT_LOG_DEBUG. */
static void dt__launch_log(const dt__rank_ctx *x, int n, int cause) {
    char same[256] = "";
    size_t len = 0;
    int i;
    const char *cm = strchr(x[cause].msg, ':');
    dt_log(DT_LOG_ERROR, "%s", x[cause].msg);
    for (i = 0; i < n; i++) {
        const char *m = strchr(x[i].msg, ':');
        if (i == cause || x[i].result == DT_OK) continue;
        if (x[i].result == DT_ERR_PEER) dt_log(DT_LOG_DEBUG, "%s", x[i].msg);
        else if (x[i].result == x[cause].result && m && cm && strchr(m + 2, ':') && strchr(cm + 2, ':') &&
                 strcmp(strchr(m + 2, ':'), strchr(cm + 2, ':')) == 0 && len + 16 < sizeof same) {
            int k = snprintf(same + len, sizeof same - len, "%s%d", len ? ", " : "", i);
            if (k > 0) len += (size_t)k;
        } else dt_log(DT_LOG_ERROR, "%s", x[i].msg);
    }
    if (len) dt_log(DT_LOG_ERROR, "rank%s %s failed the same way", strchr(same, ',') ? "s" : "", same);
}

/* Runs the ranks; with log set, logs the failures (dt__launch_log). After the first failure the others
   have their communicator's timeout and a second more to end; a rank that has not (stalled outside the
   communicator, or for good) is reported as the failure and its thread left running: its communicator,
   context and the caller's data stay as they are, and the process must exit. */
static dt_result dt__launch_local(const dt_launch_desc *desc, dt_rank_fn fn, void *arg, dt_result *results, int log) {
    dt_launch_desc d;
    dt__rank_ctx *x;
    dt_comm **comms;
    dt__trace_lane *lanes = NULL;
    dt__launch_end *e;
    int n, i, cause = -1, stalled = 0;
    dt_result r;
    if (!fn) return dt_set_error(DT_ERR_INVALID_ARG, "dt_launch: the rank function is NULL");
    if (desc) d = *desc; else memset(&d, 0, sizeof d);
    n = d.ranks > 0 ? d.ranks : 1;
    x = (dt__rank_ctx *)DT_MALLOC((size_t)n * sizeof *x);
    comms = (dt_comm **)DT_MALLOC((size_t)n * sizeof *comms);
    e = (dt__launch_end *)DT_MALLOC(sizeof *e);
    if (d.trace_path) lanes = dt__trace_lanes(n, d.trace_max_events);
    if (!x || !comms || !e || (d.trace_path && !lanes))
        r = dt_set_error(DT_ERR_OUT_OF_MEMORY, "dt_launch: no memory for %d ranks", n);
    else if (!d.trace_path || (r = dt__trace_check_path(d.trace_path)) == DT_OK)
        r = dt_comm_create_local(comms, n, &d.comm);
    if (r != DT_OK) {   /* no rank ran: logged like a rank's failure, so a program that prints nothing else says why */
        if (log) dt_log(DT_LOG_ERROR, "%s", dt_last_error());
        DT_FREE(x); DT_FREE(comms); DT_FREE(lanes); DT_FREE(e);
        return r;
    }
    memset(x, 0, (size_t)n * sizeof *x);
    memset(e, 0, sizeof *e);
    dt__mutex_init(&e->mu);
    dt__cond_init(&e->cv);
    dt__log_all_ranks = d.log_all_ranks;
    for (i = 0; i < n; i++) {
        x[i].end = e;
        x[i].comm = comms[i];
        x[i].fn = fn;
        x[i].arg = arg;
        x[i].threads = d.threads_per_rank > 0 ? d.threads_per_rank : dt__default_threads(n);
        x[i].trace = lanes ? lanes + i * DT__TRACE_LANES : NULL;
    }
    if (n == 1) dt__rank_main(&x[0]);   /* one rank runs on the calling thread */
    else {
        int started;
        for (started = 0; started < n; started++)
            if (dt__thread_start(&x[started].thread, dt__rank_main, &x[started]) != 0) break;
        for (i = started; i < n; i++) {   /* could not start: these ranks have gone */
            x[i].result = DT_ERR_OUT_OF_MEMORY;
            snprintf(x[i].msg, sizeof x[i].msg, "DT_ERR_OUT_OF_MEMORY: rank %d: its thread could not be started", i);
            dt_comm_leave(comms[i], x[i].result, x[i].msg + 22);
            x[i].ended = 1;
        }
        stalled = dt__launch_wait(e, started, dt_comm_get_desc(comms[0]).timeout + 1.0);
        for (i = 0; i < started; i++) {
            dt__mutex_lock(&e->mu);
            if (!x[i].ended) {   /* read under the mutex: the thread may end just now, and is then joined */
                x[i].result = DT_ERR_TIMEOUT;
                snprintf(x[i].msg, sizeof x[i].msg, "DT_ERR_TIMEOUT: rank %d has not returned %.3g s after the run failed: it is stalled (its "
                         "thread is left running, so the process must exit now)", i, dt_comm_get_desc(comms[0]).timeout + 1.0);
            }
            dt__mutex_unlock(&e->mu);
            if (x[i].result != DT_ERR_TIMEOUT || x[i].finished) dt__thread_join(&x[i].thread);
        }
    }
    for (i = 0; i < n; i++) {
        if (results) results[i] = x[i].result;
        if (dt__cause_rank(&x[i]) > (cause < 0 ? -1 : dt__cause_rank(&x[cause]))) cause = i;
    }
    r = DT_OK;
    if (cause >= 0) {
        if (log) dt__launch_log(x, n, cause);
        r = x[cause].result;
        dt_set_error(r, "%s", dt__cause(x[cause].msg, r));
    }
    if (stalled) {   /* the stalled threads may still use all of it but the array of pointers */
        if (lanes && log) dt_log(DT_LOG_WARN, "the timeline was not written to %s: a rank is still running", d.trace_path);
        DT_FREE(comms);
        return r;
    }
    if (lanes) {   /* also after a failure: the trace of a failed run shows where each rank was */
        char cause_msg[512];
        dt_result rt;
        snprintf(cause_msg, sizeof cause_msg, "%s", dt_last_error());
        rt = dt__trace_finish_local(d.trace_path, lanes, n);
        if (rt != DT_OK && log) dt_log(DT_LOG_ERROR, "%s", dt_last_error());
        if (rt != DT_OK && r == DT_OK) r = rt;
        else if (rt != DT_OK) dt__error_restore(cause_msg);   /* the run's failure comes first */
        dt__trace_lanes_free(lanes, n);
    }
    for (i = 0; i < n; i++) dt_comm_destroy(comms[i]);
    dt__cond_destroy(&e->cv);
    dt__mutex_destroy(&e->mu);
    DT_FREE(e);
    DT_FREE(comms);
    DT_FREE(x);
    return r;
}

dt_result dt_launch_local(const dt_launch_desc *desc, dt_rank_fn fn, void *arg, dt_result *results) {
    return dt__launch_local(desc, fn, arg, results, 0);
}

/* Started by mpiexec? Hydra (MPICH) sets PMI_SIZE, Open MPI OMPI_COMM_WORLD_SIZE, PMIx PMIX_RANK. */
static int dt__mpiexec_size(void) {
    const char *v = getenv("PMI_SIZE");
    if (!v) v = getenv("OMPI_COMM_WORLD_SIZE");
    if (!v && getenv("PMIX_RANK")) v = "2";
    return v ? atoi(v) : 0;
}

/* ---- a launcher for one rank per process (MPI's) ------------------------------------------------
   The timeline of such a run: a barrier aligns the clocks (time 0 is the moment just after it on every
   rank). At the end every rank formats its own events; rank 0 gathers the sizes, receives each rank's
   text in rank order, and broadcasts that it has them all; then it writes the one file. A rank that
   failed, or whose part of the exchange failed (a rank has died), writes its own events to PATH.rank<r>. */
#define DT__TRACE_CHUNK (1 << 26)      /* bytes per message, well below MPI's INT_MAX */

static dt_result dt__launch_trace_start(dt_comm *c, const dt_launch_desc *desc, dt__trace_lane **lanes) {
    dt_result r = dt_comm_rank(c) == 0 ? dt__trace_check_path(desc->trace_path) : DT_OK;   /* rank 0 writes the file */
    int64_t bad = r != DT_OK;
    dt_result e;
    int i;
    if ((e = dt_comm_allreduce(c, &bad, 1, DT_I64, DT_MAX, DT_ALGO_AUTO)) != DT_OK) return e;
    if (bad) return r != DT_OK ? r : dt_set_error(DT_ERR_PEER, "dt_launch: rank 0 cannot write the trace %s", desc->trace_path);
    if (!(*lanes = dt__trace_lanes(1, desc->trace_max_events)))
        return dt_set_error(DT_ERR_OUT_OF_MEMORY, "dt_launch: rank %d: no memory for the trace", dt_comm_rank(c));
    if ((r = dt_comm_barrier(c)) != DT_OK) return r;
    for (i = 0; i < DT__TRACE_LANES; i++) (*lanes)[i].origin = dt_time_now();
    dt_comm_reset_stats(c);   /* the barrier is not the program's */
    return DT_OK;
}

/* Rank 0 appends rank k's text of len bytes to t; the others send theirs. */
static dt_result dt__launch_trace_move(dt_comm *c, dt__text *t, int k, int64_t len) {
    int64_t off, part;
    size_t got = 0;
    dt_result r = DT_OK;
    if (dt_comm_rank(c) == 0 && dt__text_reserve(t, (size_t)len + 1) != 0)
        return dt_set_error(DT_ERR_OUT_OF_MEMORY, "trace: rank 0: no memory for rank %d's %lld bytes of events", k, (long long)len);
    for (off = 0; off < len && r == DT_OK; off += part) {
        part = len - off < DT__TRACE_CHUNK ? len - off : DT__TRACE_CHUNK;
        if (dt_comm_rank(c) != 0) r = dt__lib_send(c, t->p + off, (size_t)part, DT_U8, 0, DT__TAG_TRACE);
        else if ((r = dt__lib_recv(c, t->p + t->n + off, (size_t)part, DT_U8, k, DT__TAG_TRACE, &got)) == DT_OK && got != (size_t)part)
            r = dt_set_error(DT_ERR_MISMATCH, "trace: rank %d sent %zu bytes of events where %lld were due", k, got, (long long)part);
    }
    if (r == DT_OK && dt_comm_rank(c) == 0) t->n += (size_t)len;
    return r;
}

static dt_result dt__launch_trace_finish(dt_comm *c, const char *path, dt__trace_lane *lanes, int failed) {
    dt__text t;
    int64_t mine[3] = {0, 0, 0}, *all = NULL, events, dropped;   /* bytes of text, events, dropped events */
    int me = dt_comm_rank(c), k, ok = 0, done = 1;
    char own[1024];
    dt_result r = DT_OK;
    memset(&t, 0, sizeof t);
    dt__trace_format(&t, lanes, me, dt_time_now() - lanes[0].origin, &mine[1], &mine[2]);
    mine[0] = (int64_t)t.n;
    events = mine[1];
    dropped = mine[2];
    if (!failed && !t.oom && (me != 0 || (all = (int64_t *)DT_MALLOC(sizeof(int64_t) * 3 * (size_t)dt_comm_size(c))))) {
        r = dt_comm_gather(c, mine, all, 3, DT_I64, 0);
        if (me != 0 && r == DT_OK) r = dt__launch_trace_move(c, &t, 0, mine[0]);
        for (k = 1; me == 0 && k < dt_comm_size(c) && r == DT_OK; k++) {
            r = dt__launch_trace_move(c, &t, k, all[3 * k]);
            events += all[3 * k + 1];
            dropped += all[3 * k + 2];
        }
        if (r == DT_OK) r = dt_comm_broadcast(c, &done, 1, DT_I32, 0, DT_ALGO_AUTO);   /* rank 0 has every text */
        ok = r == DT_OK;
    }
    DT_FREE(all);
    if (ok && me == 0) r = dt__trace_write(path, &t, dt_comm_size(c), events, dropped, lanes[0].max);
    else if (!ok) {
        t.n = (size_t)mine[0];   /* this rank's own events */
        if (snprintf(own, sizeof own, "%s.rank%d", path, me) >= (int)sizeof own) r = dt_set_error(DT_ERR_INVALID_ARG, "trace %s: the path is too long", path);
        else {
            dt_log(DT_LOG_WARN, "trace: rank %d's events could not be gathered on rank 0 (%s); it writes them to %s", me,
                   failed ? "this rank failed" : dt_last_error(), own);
            r = dt__trace_write(own, &t, 1, mine[1], mine[2], lanes[0].max);
        }
    }
    DT_FREE(t.p);
    return r;
}

dt_result dt_launch_rank(dt_comm *c, const dt_launch_desc *desc, int local_ranks, dt_rank_fn fn, void *arg) {
    dt__trace_lane *lanes = NULL;
    dt_result r = DT_OK, rt = DT_OK;
    char m[512];
    if (!c || !desc || !fn) return dt_set_error(DT_ERR_INVALID_ARG, "dt_launch_rank: communicator, desc and rank function must not be NULL");
    dt__tls_rank = dt_comm_rank(c);
    dt__log_all_ranks = desc->log_all_ranks;
#if DT__HAVE_OMP
    omp_set_num_threads(desc->threads_per_rank > 0 ? desc->threads_per_rank : dt__default_threads(local_ranks > 0 ? local_ranks : 1));
#else
    (void)local_ranks;
#endif
    if (desc->trace_path) r = dt__launch_trace_start(c, desc, &lanes);
    dt__tls_trace = lanes;
    if (r == DT_OK) r = fn(c, arg);
    if (r == DT_OK) r = dt__fault_unfired(c);
    dt__tls_trace = NULL;
    if (r != DT_OK) {   /* logged by the backend's launcher, once for every rank that failed the same way */
        dt__rank_msg(m, sizeof m, dt_comm_rank(c), r, dt_last_error());
        dt_comm_leave(c, r, dt__cause(m, r));
    }
    if (lanes && (rt = dt__launch_trace_finish(c, desc->trace_path, lanes, r != DT_OK)) != DT_OK)
        dt_log(DT_LOG_ERROR, "%s", dt_last_error());
    if (r != DT_OK) dt_set_error(r, "%s", dt__cause(m, r));   /* the rank's failure, not the trace's */
    dt__trace_lanes_free(lanes, 1);
    dt__tls_rank = -1;
    return r != DT_OK ? r : rt;
}

/* dt_launch's launcher for a job of processes, one rank each (a program started by mpiexec): a backend's,
   registered before this implementation is compiled (with DT_USE_MPI, dtrain.h, the composition root, and
   dtrain_mpi.h define DT__LAUNCH_PROCESSES as dtrain_mpi.h's dt_launch_mpi), so this file names no
   backend. Without one, a program that mpiexec started with more than one process fails, saying to
   rebuild it. */
#ifdef DT__LAUNCH_PROCESSES
dt_result DT__LAUNCH_PROCESSES(const dt_launch_desc *desc, dt_rank_fn fn, void *arg);
#endif

dt_result dt_launch(const dt_launch_desc *desc, dt_rank_fn fn, void *arg) {
    int np = dt__mpiexec_size();
    dt_launch_desc d;
    if (desc) d = *desc; else memset(&d, 0, sizeof d);
#ifdef DT__LAUNCH_PROCESSES
    if (np > 0) return DT__LAUNCH_PROCESSES(&d, fn, arg);
#else
    if (np > 1) {
        dt_result r = dt_set_error(DT_ERR_UNSUPPORTED, "this program was started by mpiexec with %d processes but built without MPI: "
                                   "rebuild it with MPI (make MPI=1: mpicc -DDT_USE_MPI), or run it alone with --ranks %d", np, np);
        dt_log(DT_LOG_ERROR, "%s", dt_last_error() + strlen("DT_ERR_UNSUPPORTED: "));
        return r;
    }
#endif
    return dt__launch_local(&d, fn, arg, NULL, 1);
}

#ifdef __cplusplus
}
#endif
#endif /* the implementation */
