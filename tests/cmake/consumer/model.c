/* model.c - a second translation unit: dtrain.h without the implementation, as everywhere but one file. */
#include "dtrain.h"

dt_result consumer_model(dt_model **out);

/* A small CNN for [1, 8, 8] inputs and 4 classes. */
dt_result consumer_model(dt_model **out) {
    dt_model_desc d = {0};
    dt_result r;
    int x;
    d.in_c = 1; d.in_h = 8; d.in_w = 8; d.seed = 3;
    if ((r = dt_model_create(out, &d)) != DT_OK) return r;
    x = dt_relu(*out, dt_conv2d(*out, dt_model_input(*out), 4, 3, 1, 1));
    x = dt_maxpool2d(*out, x, 2, 2, 0);
    dt_linear(*out, dt_flatten(*out, x), 4, 1);
    if ((r = dt_model_finalize(*out)) != DT_OK) { dt_model_destroy(*out); *out = NULL; }
    return r;
}
