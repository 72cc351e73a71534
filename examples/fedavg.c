/* fedavg.c - federated averaging: rank 0 is the server, the clients are simulated on ranks 1..p-1 (client k
   on rank 1 + k mod (p - 1)); each round the server samples a fraction C of the clients, they train E local
   epochs of batch B from the global model on their own partition, and the server aggregates their updates.

   usage: fedavg [--ranks 4] [--clients 10] [--rounds 10] [--frac 1] [--local-epochs 1] [--batch 10]
                 [--model fedavg_cnn|fedavg_2nn|simplecnn|...] [--dataset fashion-mnist|mnist|cifar10] [--data DIR]
                 [--pad-to 0] [--partition iid|shards|dirichlet] [--alpha 0.5] [--optim sgd] [--lr 0.05] [--momentum 0]
                 [--nesterov] [--wd 0] [--milestones A,B,...] [--cosine] [--min-lr 0] [--warmup 0]
                 [--agg mean|median|trimmed|krum|multikrum|classmean] [--trim 0.1] [--krum-f 1]
                 [--attack none|labelflip|signflip|noise] [--attackers 0] [--flip 1:4] [--noise-std 1]
                 [--prox-mu 0] [--dropout-prob 0] [--class-acc C] [--per-class] [--seed 0] [--precision fp32] [--limit N] [--test-limit N] [--csv PATH]
                 [--checkpoint PATH] [--checkpoint-every N] [--resume]
   e.g.   ./build/examples/fedavg --ranks 4 --clients 10 --rounds 10 --model fedavg_2nn
          ./build/examples/fedavg --clients 5 --attack labelflip --attackers 1 --flip 1:4 --agg median

   Clients 0 .. attackers-1 are the attackers. --flip a:b maps label a to b (repeat --flip for a
   permutation). The accuracy on class --class-acc (default: the first flipped label) is logged each round,
   with the share of its test images predicted as its flipped label, and the clients the aggregator left out;
   --per-class prints the final accuracy of every class and how many rounds each client was left out.
   The optimizer and schedule flags are every example's (examples/common.h): each client's optimizer is fresh
   every round, and the schedule steps once per round (--milestones counts rounds). --lr 0 is allowed: the
   honest clients then send no change, and what moves the model is the attackers' updates alone.
   --checkpoint PATH saves the run between rounds (dt_fed_save: the server's model, every rank's buffers and
   dropout stream, the round) after every round, or every N rounds with --checkpoint-every N, and at the end;
   --resume continues from it and ends with the model and CSV rows (appended) of a run that was never
   stopped (the draw of each round is a function of the seed and the round). --per-class's rounds left out
   per client count the rounds since the resume. A fresh run refuses a PATH that exists; a model with NaN is
   never saved over the last good checkpoint; a resume with another --clients, --batch or --limit is refused.
   A round where every client dropped out says so ("no client reported"), with an empty train_loss in the CSV. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#define DTRAIN_IMPLEMENTATION
#include "../dtrain.h"
#define EX_PROG "fedavg"
#include "common.h"

typedef struct args {
    const char *model, *csv, *partition, *attack;
    long clients, rounds, local_epochs, batch, attackers, krum_f, class_acc;
    double frac, alpha, prox_mu, dropout_prob, trim, noise_std;
    int per_class;
    ex_recipe recipe;   /* --optim, --lr, --momentum, --wd, the schedule */
    dt_fed_agg agg;
    dt_fed_server_desc server;   /* --server and its settings (0: the library's defaults) */
    dt_fed_dp_desc dp;           /* --dp-clip S, --dp-noise Z: DP-FedAvg (off by default) */
    double dp_delta;             /* --dp-delta: the delta of the epsilon each round reports (default 1e-5) */
    int32_t flip[DT_FED_MAX_CLASSES];
    int flip_set;
    ex_ckpt ckpt;   /* --checkpoint, --checkpoint-every (rounds), --resume */
    ex_data data;   /* --dataset, --data, --limit, --seed and the sets main loads */
} args;

static void usage(FILE *f) {
    fprintf(f, "usage: fedavg [--ranks N] [--clients N] [--rounds N] [--frac C] [--local-epochs E] [--batch B] [--model NAME]\n"
               "              [--dataset fashion-mnist|mnist|cifar10] [--data DIR] [--pad-to S] [--partition iid|shards|dirichlet] [--alpha A]\n");
    ex_recipe_usage(f, 14, 0);
    fprintf(f, "              [--agg mean|median|trimmed|krum|multikrum|classmean] [--trim F] [--krum-f F]\n"
               "              [--attack none|labelflip|signflip|noise] [--attackers K] [--flip A:B]\n"
               "              [--noise-std S] [--prox-mu MU] [--dropout-prob P] [--class-acc C] [--per-class]\n"
               "              [--server avg|avgm|adagrad|adam|yogi] [--server-lr LR] [--server-momentum B1] [--server-beta2 B2] [--server-tau T]\n"
               "              [--dp-clip S] [--dp-noise Z] [--dp-delta D]\n"
               "              [--seed N] [--precision fp32|bf16] [--limit N] [--test-limit N] [--csv PATH]\n");
    ex_ckpt_usage(f, 14);
}

static int parse_args(int argc, char **argv, void *arg) {
    args *a = (args *)arg;
    int i, k;
    a->model = "fedavg_2nn"; a->data.dataset = "fashion-mnist"; a->partition = "iid"; a->attack = "none";
    a->clients = 10; a->rounds = 10; a->frac = 1.0; a->local_epochs = 1; a->batch = 10; a->recipe.lr = 0.05;
    a->recipe.lr_zero = 1;   /* see the top comment */
    a->alpha = 0.5; a->class_acc = -1; a->krum_f = 1; a->noise_std = 1.0; a->trim = 0.1;   /* the library's defaults; 0 means 0 */
    a->dp_delta = 1e-5;
    for (k = 0; k < DT_FED_MAX_CLASSES; k++) a->flip[k] = k;
    for (i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int bad = 0;
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) { usage(stdout); exit(0); }
        if (!strcmp(f, "--per-class")) { a->per_class = 1; continue; }
        if ((k = ex_recipe_flag(f, v, &a->recipe, &bad)) != 0) { if (bad) return -1; i += k - 1; continue; }
        if ((k = ex_ckpt_flag(f, v, &a->ckpt, &bad)) != 0) { if (bad) return -1; i += k - 1; continue; }
        if (!v) { fprintf(stderr, "fedavg: %s needs a value\n", f); return -1; }
        if (!strcmp(f, "--model")) a->model = v;
        else if (!strcmp(f, "--csv")) a->csv = v;
        else if (!strcmp(f, "--partition")) a->partition = v;
        else if (!strcmp(f, "--attack")) a->attack = v;
        else if (!strcmp(f, "--agg")) {
            if (dt_fed_agg_parse(v, &a->agg) != DT_OK) { fprintf(stderr, "fedavg: %s\n", dt_last_error()); return -1; }
        }
        else if (!strcmp(f, "--server")) {
            if (dt_fed_server_parse(v, &a->server.kind) != DT_OK) { fprintf(stderr, "fedavg: %s\n", dt_last_error()); return -1; }
        }
        else if (!strncmp(f, "--server-", 9)) {   /* lr, momentum, beta2, tau: each > 0; momentum and beta2 < 1 */
            double x = 0.0;
            float *to = !strcmp(f + 9, "lr") ? &a->server.lr : !strcmp(f + 9, "momentum") ? &a->server.momentum :
                        !strcmp(f + 9, "beta2") ? &a->server.beta2 : !strcmp(f + 9, "tau") ? &a->server.tau : NULL;
            if (!to) { fprintf(stderr, "fedavg: unknown flag '%s'\n", f); usage(stderr); return -1; }
            bad = parse_double(f, v, &x) || !(x > 0.0) || ((to == &a->server.momentum || to == &a->server.beta2) && !(x < 1.0));
            *to = (float)x;
        }
        else if (!strcmp(f, "--dp-clip") || !strcmp(f, "--dp-noise")) {   /* both >= 0 (the library refuses noise without a clip) */
            double x = 0.0;
            bad = parse_double(f, v, &x) || !(x >= 0.0);
            if (f[5] == 'c') a->dp.clip = (float)x; else a->dp.noise_multiplier = (float)x;
        }
        else if (!strcmp(f, "--dp-delta")) bad = parse_double(f, v, &a->dp_delta) || !(a->dp_delta > 0.0 && a->dp_delta < 1.0);
        else if (!strcmp(f, "--flip")) {
            int from, to;
            bad = sscanf(v, "%d:%d", &from, &to) != 2 || from < 0 || to < 0 || from >= DT_FED_MAX_CLASSES;
            if (!bad) { a->flip[from] = to; if (!a->flip_set && a->class_acc < 0) a->class_acc = from; a->flip_set = 1; }
        }
        else if (!strcmp(f, "--clients")) bad = parse_long(f, v, 1, &a->clients);
        else if (!strcmp(f, "--rounds")) bad = parse_long(f, v, 1, &a->rounds);
        else if (!strcmp(f, "--local-epochs")) bad = parse_long(f, v, 1, &a->local_epochs);
        else if (!strcmp(f, "--attackers")) bad = parse_long(f, v, 0, &a->attackers);
        else if (!strcmp(f, "--krum-f")) bad = parse_long(f, v, 0, &a->krum_f);
        else if (!strcmp(f, "--class-acc")) bad = parse_long(f, v, 0, &a->class_acc);
        else if (!strcmp(f, "--frac")) bad = parse_double(f, v, &a->frac) || !(a->frac > 0.0 && a->frac <= 1.0);
        else if (!strcmp(f, "--alpha")) bad = parse_double(f, v, &a->alpha);
        else if (!strcmp(f, "--prox-mu")) bad = parse_double(f, v, &a->prox_mu);
        else if (!strcmp(f, "--dropout-prob")) bad = parse_double(f, v, &a->dropout_prob) || a->dropout_prob >= 1.0;
        else if (!strcmp(f, "--trim")) bad = parse_double(f, v, &a->trim);
        else if (!strcmp(f, "--noise-std")) bad = parse_double(f, v, &a->noise_std);
        else if (!ex_flag(f, v, &a->data, NULL, &a->batch, &bad)) {   /* not one of the common flags */
            fprintf(stderr, "fedavg: unknown flag '%s'\n", f); usage(stderr); return -1;
        }
        if (bad) { fprintf(stderr, "fedavg: bad value '%s' for %s\n", v, f); return -1; }
        i++;
    }
    if (dt_zoo_parse(a->model, NULL) != DT_OK) { fprintf(stderr, "fedavg: %s\n", dt_last_error()); return -1; }
    if (strcmp(a->attack, "none") && strcmp(a->attack, "labelflip") && strcmp(a->attack, "signflip") && strcmp(a->attack, "noise")) {
        fprintf(stderr, "fedavg: unknown --attack '%s': use none, labelflip, signflip or noise\n", a->attack);
        return -1;
    }
    if (strcmp(a->partition, "iid") && strcmp(a->partition, "shards") && strcmp(a->partition, "dirichlet")) {
        fprintf(stderr, "fedavg: unknown --partition '%s': use iid, shards or dirichlet\n", a->partition);
        return -1;
    }
    if (!(a->trim > 0.0 && a->trim < 0.5)) {   /* a trim of 0 cuts nothing: an unweighted mean, not worth its name */
        fprintf(stderr, "fedavg: --trim %g: the fraction cut at each end must be > 0 and < 0.5 (a trim of 0 cuts nothing: use --agg mean)\n", a->trim);
        return -1;
    }
    if (!(a->alpha > 0.0)) { fprintf(stderr, "fedavg: --alpha must be > 0 (0.1 = strong label skew, 100 = near IID)\n"); return -1; }
    if (a->attackers > a->clients) { fprintf(stderr, "fedavg: --attackers %ld > --clients %ld\n", a->attackers, a->clients); return -1; }
    if (a->dp.noise_multiplier > 0.0f && !(a->dp.clip > 0.0f)) {   /* the noise's scale is the clipping norm's */
        fprintf(stderr, "fedavg: --dp-noise needs --dp-clip S > 0: the noise's std is Z x S / clients per round\n");
        return -1;
    }
    if (a->dp.clip > 0.0f && a->agg != DT_FED_MEAN) {
        fprintf(stderr, "fedavg: --dp-clip: DP-FedAvg's bound holds for the mean of the clipped updates: drop --agg %s\n", dt_fed_agg_name(a->agg));
        return -1;
    }
    if (!strcmp(a->attack, "labelflip") && !a->flip_set) {   /* without a map the attackers would train honestly */
        fprintf(stderr, "fedavg: --attack labelflip needs --flip A:B (label A trained as B; repeat it for more labels)\n");
        return -1;
    }
    return ex_recipe_check(&a->recipe, a->rounds, "rounds") || ex_ckpt_check(&a->ckpt) || (a->csv && ex_out_check("--csv", a->csv)) ? -1 : 0;
}

/* After loading: --class-acc must name a class of the dataset. */
static int prepare(void *arg) {
    args *a = (args *)arg;
    ex_ckpt_keep(&a->ckpt, "--clients", a->clients, NULL);   /* what a checkpoint to resume must agree with */
    if (ex_ckpt_prepare(&a->ckpt, &a->data, a->batch, a->rounds, "round", " (each client's batch)")) return 2;
    if (a->class_acc < a->data.test.num_classes) return 0;
    fprintf(stderr, "fedavg: --class-acc %ld: %s has classes 0..%lld\n", a->class_acc, a->data.dataset, (long long)a->data.test.num_classes - 1);
    return 2;
}

/* The partition in words, with its parameter: "iid", "shards", "dirichlet alpha 0.1". Returns buf. */
static const char *part_str(const args *a, char *buf, size_t size) {
    if (!strcmp(a->partition, "dirichlet")) snprintf(buf, size, "dirichlet alpha %g", a->alpha);
    else snprintf(buf, size, "%s", a->partition);
    return buf;
}

/* The rest of what shapes a run, its defaults included, for the header line: FedProx's mu, the drop-out
   probability, the aggregator with its parameter, the attack with its own, a server optimizer other than
   FedAvg's with its settings. Returns buf. */
static const char *setup_str(const args *a, char *buf, size_t size) {
    size_t n = (size_t)snprintf(buf, size, "prox mu %g, dropout prob %g; aggregator %s", a->prox_mu, a->dropout_prob,
                                dt_fed_agg_name(a->agg));
    int k;
    if (n < size && a->agg == DT_FED_TRIMMED) n += (size_t)snprintf(buf + n, size - n, " (trim %g)", a->trim);
    if (n < size && (a->agg == DT_FED_KRUM || a->agg == DT_FED_MULTIKRUM)) n += (size_t)snprintf(buf + n, size - n, " (f %ld)", a->krum_f);
    if (n < size) n += (size_t)snprintf(buf + n, size - n, "; attack %s", a->attack);
    if (n < size && !strcmp(a->attack, "noise")) n += (size_t)snprintf(buf + n, size - n, " (std %g)", a->noise_std);
    for (k = 0; k < DT_FED_MAX_CLASSES && n < size && !strcmp(a->attack, "labelflip"); k++)
        if (a->flip[k] != k) n += (size_t)snprintf(buf + n, size - n, " %d:%d", k, (int)a->flip[k]);
    if (n < size) n += (size_t)snprintf(buf + n, size - n, " by %ld clients", a->attackers);
    if (n < size && a->server.kind == DT_FED_SERVER_AVGM)   /* the defaults as dt_fed_create fills them in */
        n += (size_t)snprintf(buf + n, size - n, "; server avgm (lr %g, momentum %g)", a->server.lr ? a->server.lr : 1.0,
                              a->server.momentum ? a->server.momentum : 0.9);
    else if (n < size && a->server.kind != DT_FED_SERVER_AVG)
        n += (size_t)snprintf(buf + n, size - n, "; server %s (lr %g, momentum %g, beta2 %g, tau %g)", dt_fed_server_name(a->server.kind),
                              a->server.lr ? a->server.lr : 0.01, a->server.momentum ? a->server.momentum : 0.9,
                              a->server.beta2 ? a->server.beta2 : 0.99, a->server.tau ? a->server.tau : 0.001);
    if (n < size && a->dp.clip > 0.0f)
        snprintf(buf + n, size - n, "; DP-FedAvg: updates clipped to %g, noise multiplier %g, epsilon for delta %g", (double)a->dp.clip,
                 (double)a->dp.noise_multiplier, a->dp_delta);
    return buf;
}

#define TRY(call) do { if ((r = (call)) != DT_OK) goto done; } while (0)

/* conf[y * K + p]: the test images of class y that the model predicts as p (K classes). */
static dt_result confusion(dt_model *m, const args *a, int64_t *conf) {
    int64_t K = a->data.test.num_classes, i, j, s, n, ids[1000];
    int32_t y[1000];
    float *x = (float *)malloc(sizeof(float) * 1000 * (size_t)(a->data.test.c * a->data.test.h * a->data.test.w));
    float *out = (float *)malloc(sizeof(float) * 1000 * (size_t)K);
    dt_result r = x && out ? DT_OK : dt_set_error(DT_ERR_OUT_OF_MEMORY, "no memory");
    dt_mode mode = dt_model_mode(m);
    dt_batch_desc b;
    memset(&b, 0, sizeof b);
    b.indices = ids; b.transform = &a->data.te;
    memset(conf, 0, sizeof(int64_t) * (size_t)(K * K));
    dt_model_set_mode(m, DT_MODE_EVAL);
    for (s = 0; r == DT_OK && s < a->data.test.count; s += n) {
        n = a->data.test.count - s < 1000 ? a->data.test.count - s : 1000;
        for (i = 0; i < n; i++) ids[i] = s + i;
        b.count = n;
        if ((r = dt_dataset_batch(&a->data.test, &b, x, y)) != DT_OK || (r = dt_model_forward(m, x, n)) != DT_OK ||
            (r = dt_model_get_output(m, out, n * K)) != DT_OK) break;
        for (i = 0; i < n; i++) {
            int64_t best = 0;
            for (j = 1; j < K; j++) if (out[i * K + j] > out[i * K + best]) best = j;
            conf[y[i] * K + best]++;
        }
    }
    dt_model_set_mode(m, mode);
    free(x);
    free(out);
    return r;
}

/* Share of class c's test images predicted as p. */
static double conf_rate(const int64_t *conf, int64_t K, int64_t c, int64_t p) {
    int64_t j, n = 0;
    for (j = 0; j < K; j++) n += conf[c * K + j];
    return n ? (double)conf[c * K + p] / (double)n : 0.0;
}

static dt_result rank_main(dt_comm *c, void *arg) {
    args *a = (args *)arg;
    int me = dt_comm_rank(c), *behaviour = NULL, beh = DT_FED_HONEST, *sel = NULL, *dropped = NULL, *kept = NULL, i, nsel;
    int64_t ntrain = a->data.ntrain, t, K = a->data.test.num_classes;
    int64_t *conf = NULL;
    long *left = NULL;   /* rounds each client's report was left out of the aggregate */
    dt_model *m = NULL;
    dt_fed *f = NULL;
    dt_partition part;
    dt_partition_desc pd;
    dt_fed_desc fd;
    dt_checkpoint_meta meta;   /* the rounds done (round and step) */
    FILE *csv = NULL;
    char recipe[256], part_s[64], setup[256];
    dt_result r = DT_OK;
    long k;

    memset(&part, 0, sizeof part);
    TRY(ex_model_create(&m, a->model, &a->data, 0));
    memset(&pd, 0, sizeof pd);   /* client k's samples: part k, the same split on every rank */
    pd.count = ntrain; pd.parts = (int)a->clients; pd.seed = (uint64_t)a->data.seed; pd.labels = a->data.train.labels;
    TRY(dt_partition_kind_parse(a->partition, &pd.kind));   /* iid, shards (2 per client) or dirichlet */
    if (pd.kind == DT_PARTITION_DIRICHLET) { pd.num_classes = a->data.train.num_classes; pd.alpha = (float)a->alpha; }
    TRY(dt_partition_create(&part, &pd));
    if (!strcmp(a->attack, "labelflip")) beh = DT_FED_LABELFLIP;
    else if (!strcmp(a->attack, "signflip")) beh = DT_FED_SIGNFLIP;
    else if (!strcmp(a->attack, "noise")) beh = DT_FED_NOISE;
    behaviour = (int *)calloc((size_t)a->clients, sizeof(int)); sel = (int *)calloc((size_t)a->clients, sizeof(int));
    dropped = (int *)calloc((size_t)a->clients, sizeof(int)); kept = (int *)calloc((size_t)a->clients, sizeof(int));
    left = (long *)calloc((size_t)a->clients, sizeof(long)); conf = (int64_t *)calloc((size_t)(K * K), sizeof(int64_t));
    if (!behaviour || !sel || !dropped || !kept || !left || !conf) { r = dt_set_error(DT_ERR_OUT_OF_MEMORY, "no memory"); goto done; }
    for (k = 0; k < a->attackers; k++) behaviour[k] = beh;

    memset(&fd, 0, sizeof fd);
    fd.clients = (int)a->clients; fd.frac = (float)a->frac; fd.local_epochs = (int)a->local_epochs; fd.batch = a->batch;
    ex_recipe_optim(&a->recipe, &fd.optim);
    ex_recipe_sched(&a->recipe, a->rounds, &fd.sched);   /* stepped once per round */
    fd.prox_mu = (float)a->prox_mu; fd.dropout_prob = (float)a->dropout_prob;
    fd.agg.kind = a->agg; fd.agg.trim = (float)a->trim; fd.agg.f = (int)a->krum_f;
    fd.server = a->server; fd.dp = a->dp;
    fd.data = &a->data.train; fd.part = &part; fd.transform = &a->data.tt; fd.behaviour = behaviour;
    memcpy(fd.flip, a->flip, sizeof fd.flip); fd.flip_set = a->flip_set;
    fd.noise_std = (float)a->noise_std; fd.seed = (uint64_t)a->data.seed;
    TRY(dt_fed_create(&f, c, m, &fd));
    memset(&meta, 0, sizeof meta);
    if (a->ckpt.resume) TRY(ex_ckpt_load(&a->ckpt, c, EX_FED, f, m, NULL, &meta, NULL));
    if (me == 0) {
        if (a->ckpt.resume) ex_ckpt_resumed(&a->ckpt, &meta, "round");
        if (a->ckpt.resume) TRY(ex_csv_keep(a->csv, meta.round));   /* the rows the checkpoint covers */
        TRY(ex_csv_open(&csv, a->csv, "round,time_s,lr,selected,dropped,kept,train_loss,test_loss,test_acc,class_acc,flip_rate,left_out\n",
                        a->ckpt.resume));
        printf("%s on %s: %lld training samples over %ld clients (%s), %lld parameters (%s); C %g, E %ld, B %ld, %s; %s; "
               "%d ranks (%s); seed %ld\n", a->model, a->data.name, (long long)ntrain, a->clients, part_str(a, part_s, sizeof part_s),
               (long long)dt_model_param_count(m), dt_precision_name(a->data.precision), a->frac, a->local_epochs, a->batch,
               ex_recipe_str(&a->recipe, a->rounds, "rounds", recipe, sizeof recipe), setup_str(a, setup, sizeof setup),
               dt_comm_size(c), dt_comm_backend_name(c), a->data.seed);
        TRY(ex_log_flush());
    }
    for (t = meta.round; t < a->rounds; t++) {
        dt_fed_round_info info;
        dt_eval_result ev;
        double t0 = dt_time_now(), secs, cacc = 0.0, frate = 0.0;
        char out[512] = "";   /* the clients whose reports the aggregator left out, e.g. "0 3" */
        char loss_s[64], loss_csv[32];   /* the training loss in the log and the CSV ("" when no client reported) */
        TRY(dt_fed_round(f, t, &info));
        secs = dt_time_now() - t0;
        if (me == 0) {   /* the server's model: evaluated, logged and written to the CSV */
            TRY(ex_test(m, &a->data, 1, &ev));
            if (a->class_acc >= 0) {
                TRY(confusion(m, a, conf));
                cacc = conf_rate(conf, K, a->class_acc, a->class_acc);
                frate = a->flip[a->class_acc] != a->class_acc ? conf_rate(conf, K, a->class_acc, a->flip[a->class_acc]) : 0.0;
            }
            nsel = dt_fed_draw(f, t, sel, dropped);
            dt_fed_last_kept(f, kept);
            for (i = 0; i < nsel; i++) {
                if (dropped[i] || kept[sel[i]] || info.kept == 0) continue;
                left[sel[i]]++;
                if (strlen(out) + 12 < sizeof out) sprintf(out + strlen(out), "%s%d", *out ? " " : "", sel[i]);
            }
            if (info.samples > 0) {   /* a round where every client dropped out has no training loss: it says so */
                snprintf(loss_s, sizeof loss_s, "train loss %.4f", info.train_loss);
                snprintf(loss_csv, sizeof loss_csv, "%.6f", info.train_loss);
            } else {
                snprintf(loss_s, sizeof loss_s, "no client reported, the global model is kept");
                loss_csv[0] = '\0';
            }
            printf("round %3lld/%ld  %6.2fs  lr %.4g  clients %d (dropped %d, kept %d)  %s  test loss %.4f  "
                   "test acc %6.2f%%", (long long)t + 1, a->rounds, secs, (double)info.lr, info.selected, info.dropped, info.kept,
                   loss_s, ev.loss, 100.0 * ev.top1);
            if (a->class_acc >= 0) printf("  class %ld acc %6.2f%%", a->class_acc, 100.0 * cacc);
            if (a->class_acc >= 0 && a->flip[a->class_acc] != a->class_acc) printf(" (as %d: %.2f%%)", (int)a->flip[a->class_acc], 100.0 * frate);
            if (*out) printf("  left out %s", out);
            if (a->dp.clip > 0.0f)   /* the privacy spent so far: rounds t + 1 of the sampled Gaussian mechanism at q = nsel / N */
                printf("  epsilon %.3f", dt_dp_epsilon((double)nsel / (double)a->clients, (double)a->dp.noise_multiplier, t + 1, a->dp_delta, NULL));
            printf("\n");
            TRY(ex_log_flush());
            TRY(ex_csv_row(csv, a->csv, "%lld,%.3f,%g,%d,%d,%d,%s,%.6f,%.6f,%.6f,%.6f,%s\n", (long long)t + 1, secs, (double)info.lr,
                           info.selected, info.dropped, info.kept, loss_csv, ev.loss, ev.top1, cacc, frate, out));
        }
        meta.round = meta.step = meta.epoch = t + 1;   /* epoch too: ex_ckpt_resumed says the round */
        if (ex_ckpt_due(&a->ckpt, t + 1, 0, 0) || ex_ckpt_due(&a->ckpt, t + 1, 1, t + 1 == a->rounds))   /* every N, or each round; the last */
            TRY(ex_ckpt_save(&a->ckpt, c, EX_FED, f, m, NULL, &meta, NULL));
    }
    if (me == 0 && a->per_class) {   /* the final model's accuracy on each class, and the rounds each client was left out */
        TRY(confusion(m, a, conf));
        printf("per-class test accuracy:");
        for (t = 0; t < K; t++) printf(" %lld:%.2f%%", (long long)t, 100.0 * conf_rate(conf, K, t, t));
        printf("\nrounds left out of the aggregate, per client:");
        for (k = 0; k < a->clients; k++) printf(" %ld", left[k]);
        if (a->ckpt.resume) printf(" (since the resume)");
        printf("\n");
    }
done:
    if (csv) fclose(csv);
    dt_fed_destroy(f);
    dt_model_destroy(m);
    dt_partition_free(&part);
    free(behaviour); free(sel); free(dropped); free(kept); free(left); free(conf);
    return r;
}

static const ex_example EXAMPLE = {usage, parse_args, prepare, rank_main};

int main(int argc, char **argv) {
    static args a;   /* zeroed; parse_args sets the defaults */
    return ex_main(argc, argv, &EXAMPLE, &a, &a.data);
}
