/* libFuzzer target: the checkpoint reader on arbitrary bytes. It must refuse what is not a valid
   checkpoint of the model with an error, never crash or read out of bounds, and leave the model as it
   was unless the load succeeds. Seeds: fuzz/corpus/fuzz_checkpoint/ (written by running the target with
   DT_FUZZ_WRITE_SEED=path once). */
#define _POSIX_C_SOURCE 200809L   /* getpid */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#define DTRAIN_IMPLEMENTATION
#include "../dtrain.h"

static dt_model *model;
static dt_optim *optim;
static char path[256];

static void setup(void) {
    dt_model_desc d;
    dt_optim_desc od;
    int x;
    memset(&d, 0, sizeof d);
    d.in_c = 1; d.in_h = 6; d.in_w = 6; d.seed = 1;
    if (dt_model_create(&model, &d) != DT_OK) abort();
    x = dt_relu(model, dt_batchnorm(model, dt_conv2d(model, 0, 2, 3, 1, 1)));
    dt_linear(model, dt_flatten(model, x), 3, 1);
    if (dt_model_finalize(model) != DT_OK) abort();
    memset(&od, 0, sizeof od);
    od.kind = DT_OPTIM_SGD; od.lr = DT_DEFAULT; od.momentum = 0.9f;
    if (dt_optim_create(&optim, model, &od) != DT_OK) abort();
    snprintf(path, sizeof path, "%s/dt_fuzz_ckpt_%d.bin", getenv("TMPDIR") && getenv("TMPDIR")[0] ? getenv("TMPDIR") : "/tmp",
             (int)getpid());
    if (getenv("DT_FUZZ_WRITE_SEED") && dt_checkpoint_save(getenv("DT_FUZZ_WRITE_SEED"), model, optim, NULL) != DT_OK) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    FILE *f;
    dt_checkpoint_meta meta;
    if (!model) setup();
    if (!(f = fopen(path, "wb"))) return 0;
    fwrite(data, 1, size, f);
    fclose(f);
    (void)dt_checkpoint_load(path, model, optim, &meta);
    (void)dt_checkpoint_load(path, model, NULL, NULL);
    remove(path);
    return 0;
}
