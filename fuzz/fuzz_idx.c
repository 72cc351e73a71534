/* libFuzzer target: dt_dataset_load_idx. Input: 2 bytes (big-endian length L), then L bytes of the images
   file, then the labels file (either may be gzip). */
#include "fuzz_util.h"
#define DTRAIN_IMPLEMENTATION
#include "../dtrain.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    dt_dataset ds;
    size_t split;
    if (size < 2) return 0;
    split = ((size_t)data[0] << 8) | data[1];
    if (split > size - 2) split = size - 2;
    fz_write("images", data + 2, split);
    fz_write("labels", data + 2 + split, size - 2 - split);
    fz_check(dt_dataset_load_idx(&ds, fz_path("images"), fz_path("labels")), &ds);
    dt_dataset_free(&ds);
    return 0;
}
