/* dtrain/core/zoo.h - the model zoo: the models people teach with, built by the builder's calls.   Part of
   dtrain v0.1.0, MIT license (see the end of dtrain.h, which is the manual and the one include).

   WHAT IS HERE
     MLP, SimpleCNN, LeNet-5, the FedAvg paper's CNN and 2NN, VGG-11 and ResNet-20, each named layer by
     layer as the usual PyTorch module is, so that parameter names match "features.0.weight" & co.
   USES
     dtrain/core/nn.h's public builder calls only (dt_conv2d_ex, dt_relu, dt_add, ...) and what it includes.
   READ FIRST
     dt__zoo_build.
*/
#ifndef DTRAIN_ZOO_H
#define DTRAIN_ZOO_H
#include "nn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Model zoo. Each builds on a created, empty model (input shape from its desc), names its layers as the
   usual PyTorch modules do, and finalizes it. num_classes 0 = 10. */
typedef enum dt_zoo_model {
    DT_ZOO_MLP = 0,       /* flatten, hidden layers of `width` (default 512, 256) with ReLU, linear */
    DT_ZOO_SIMPLE_CNN,    /* tutorial CNN for 1x28x28: 421,642 parameters; log-softmax output */
    DT_ZOO_LENET5,        /* LeNet-5 for 1x28x28 (padding 2 on conv1): 61,706 parameters */
    DT_ZOO_FEDAVG_CNN,    /* McMahan et al. CNN for 1x28x28: 1,663,370 parameters */
    DT_ZOO_FEDAVG_2NN,    /* McMahan et al. 2NN (784-200-200-10): 199,210 parameters */
    DT_ZOO_VGG11,         /* VGG-11 with batchnorm for 3x32x32: 9,231,114 parameters */
    DT_ZOO_RESNET20,      /* ResNet-20 (option A shortcuts) for 3x32x32: 269,722 parameters */
    DT_ZOO_COUNT
} dt_zoo_model;
const char *dt_zoo_name(dt_zoo_model z);                  /* "resnet20", ... */
dt_result   dt_zoo_parse(const char *name, dt_zoo_model *out);   /* DT_ERR_INVALID_ARG naming the models */
/* Creates and finalizes a zoo model. desc's input shape is filled in when zero. */
dt_result dt_zoo_create(dt_model **out, dt_zoo_model z, int64_t num_classes, const dt_model_desc *desc);

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_ZOO_H */

#if defined(DTRAIN_IMPLEMENTATION) && !defined(DTRAIN_ZOO_IMPLEMENTATION_DONE)
#define DTRAIN_ZOO_IMPLEMENTATION_DONE

#ifdef __cplusplus
extern "C" {
#endif
#include "internal.h"

static const char *const dt__zoo_names[DT_ZOO_COUNT] = {"mlp", "simplecnn", "lenet5", "fedavg_cnn", "fedavg_2nn", "vgg11", "resnet20"};
const char *dt_zoo_name(dt_zoo_model z) { return (z >= 0 && z < DT_ZOO_COUNT) ? dt__zoo_names[z] : "unknown"; }
dt_result dt_zoo_parse(const char *name, dt_zoo_model *out) {
    int k = 0;
    dt_result r = dt__enum_parse(dt__zoo_names, DT_ZOO_COUNT, name, &k, "model");
    if (r == DT_OK && out) *out = (dt_zoo_model)k;
    return r;
}

/* conv (optionally without bias) + name */
static int dt__zconv(dt_model *m, int x, int64_t oc, int64_t k, int64_t s, int64_t p, int no_bias, const char *name) {
    dt_conv2d_desc d;
    memset(&d, 0, sizeof d);
    d.out_channels = oc; d.kernel = k; d.stride = s; d.pad = p; d.no_bias = no_bias;
    return dt_model_set_node_name(m, dt_conv2d_ex(m, x, &d), name);
}
static int dt__zfc(dt_model *m, int x, int64_t out, const char *name) {
    return dt_model_set_node_name(m, dt_linear(m, x, out, 1), name);
}

static void dt__zoo_build(dt_model *m, dt_zoo_model z, int64_t nc) {
    int x = dt_model_input(m), i;
    char nm[64];
    switch (z) {
    case DT_ZOO_MLP: case DT_ZOO_FEDAVG_2NN: {   /* two hidden layers with ReLU */
        int64_t h1 = z == DT_ZOO_MLP ? 512 : 200, h2 = z == DT_ZOO_MLP ? 256 : 200;
        x = dt_relu(m, dt__zfc(m, dt_flatten(m, x), h1, "fc1"));
        dt__zfc(m, dt_relu(m, dt__zfc(m, x, h2, "fc2")), nc, "fc3");
    } break;
    case DT_ZOO_SIMPLE_CNN:
        x = dt_maxpool2d(m, dt_relu(m, dt__zconv(m, x, 32, 3, 1, 1, 0, "conv1")), 2, 2, 0);
        x = dt_maxpool2d(m, dt_relu(m, dt__zconv(m, x, 64, 3, 1, 1, 0, "conv2")), 2, 2, 0);
        x = dt_flatten(m, dt_model_set_node_name(m, dt_dropout(m, x, 0.25f), "dropout1"));
        x = dt_model_set_node_name(m, dt_dropout(m, dt_relu(m, dt__zfc(m, x, 128, "fc1")), 0.5f), "dropout2");
        dt_log_softmax(m, dt__zfc(m, x, nc, "fc2"));
        break;
    case DT_ZOO_LENET5:
        x = dt_maxpool2d(m, dt_relu(m, dt__zconv(m, x, 6, 5, 1, 2, 0, "conv1")), 2, 2, 0);
        x = dt_maxpool2d(m, dt_relu(m, dt__zconv(m, x, 16, 5, 1, 0, 0, "conv2")), 2, 2, 0);
        x = dt_flatten(m, x);
        x = dt_relu(m, dt__zfc(m, x, 120, "fc1"));
        x = dt_relu(m, dt__zfc(m, x, 84, "fc2"));
        dt__zfc(m, x, nc, "fc3");
        break;
    case DT_ZOO_FEDAVG_CNN:
        x = dt_maxpool2d(m, dt_relu(m, dt__zconv(m, x, 32, 5, 1, 2, 0, "conv1")), 2, 2, 0);
        x = dt_maxpool2d(m, dt_relu(m, dt__zconv(m, x, 64, 5, 1, 2, 0, "conv2")), 2, 2, 0);
        x = dt_flatten(m, x);
        x = dt_relu(m, dt__zfc(m, x, 512, "fc1"));
        dt__zfc(m, x, nc, "fc2");
        break;
    case DT_ZOO_VGG11: {
        static const int cfg[] = {64, 0, 128, 0, 256, 256, 0, 512, 512, 0, 512, 512, 0};
        int idx = 0;   /* index in PyTorch's nn.Sequential, so names match "features.N.weight" */
        for (i = 0; i < (int)(sizeof cfg / sizeof cfg[0]); i++) {
            if (cfg[i] == 0) { x = dt_maxpool2d(m, x, 2, 2, 0); idx++; continue; }
            snprintf(nm, sizeof nm, "features.%d", idx);
            x = dt__zconv(m, x, cfg[i], 3, 1, 1, 0, nm);
            snprintf(nm, sizeof nm, "features.%d", idx + 1);
            x = dt_relu(m, dt_model_set_node_name(m, dt_batchnorm(m, x), nm));
            idx += 3;
        }
        dt__zfc(m, dt_flatten(m, x), nc, "classifier");
    } break;
    case DT_ZOO_RESNET20: {
        int64_t cin = 16;
        int stage, blk, b = 0;
        x = dt_relu(m, dt_model_set_node_name(m, dt_batchnorm(m, dt__zconv(m, x, 16, 3, 1, 1, 1, "conv1")), "bn1"));
        for (stage = 0; stage < 3; stage++) {
            int64_t cout = 16 << stage;
            for (blk = 0; blk < 3; blk++, b++) {
                int64_t s = (stage > 0 && blk == 0) ? 2 : 1;
                int y, sc = x;
                snprintf(nm, sizeof nm, "layers.%d.conv1", b);
                y = dt__zconv(m, x, cout, 3, s, 1, 1, nm);
                snprintf(nm, sizeof nm, "layers.%d.bn1", b);
                y = dt_relu(m, dt_model_set_node_name(m, dt_batchnorm(m, y), nm));
                snprintf(nm, sizeof nm, "layers.%d.conv2", b);
                y = dt__zconv(m, y, cout, 3, 1, 1, 1, nm);
                snprintf(nm, sizeof nm, "layers.%d.bn2", b);
                y = dt_model_set_node_name(m, dt_batchnorm(m, y), nm);
                if (s != 1 || cin != cout) sc = dt_pad_shortcut(m, x, cout, s);
                x = dt_relu(m, dt_add(m, y, sc));
                cin = cout;
            }
        }
        dt__zfc(m, dt_global_avgpool(m, x), nc, "fc");
    } break;
    default: break;
    }
}

dt_result dt_zoo_create(dt_model **out, dt_zoo_model z, int64_t num_classes, const dt_model_desc *desc) {
    dt_model_desc d;
    dt_result r;
    int cifar = z == DT_ZOO_VGG11 || z == DT_ZOO_RESNET20;
    if (!out) return dt_set_error(DT_ERR_INVALID_ARG, "dt_zoo_create: out is NULL");
    *out = NULL;
    if (z < 0 || z >= DT_ZOO_COUNT)
        return dt_set_error(DT_ERR_INVALID_ARG, "dt_zoo_create: unknown model %d; use a dt_zoo_model value", (int)z);
    if (num_classes < 0) return dt_set_error(DT_ERR_INVALID_ARG, "dt_zoo_create: num_classes is %lld", (long long)num_classes);
    if (desc) d = *desc;
    else memset(&d, 0, sizeof d);
    if (d.in_c == 0) { d.in_c = cifar ? 3 : 1; d.in_h = d.in_w = cifar ? 32 : 28; }
    if ((r = dt_model_create(out, &d)) != DT_OK) return r;
    dt__zoo_build(*out, z, num_classes ? num_classes : 10);
    if ((r = dt_model_finalize(*out)) != DT_OK) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", dt_last_error());
        dt_model_destroy(*out);
        *out = NULL;
        return dt_set_error(r, "dt_zoo_create(%s): %s", dt_zoo_name(z), msg);
    }
    return DT_OK;
}

#ifdef __cplusplus
}
#endif
#endif /* the implementation */
