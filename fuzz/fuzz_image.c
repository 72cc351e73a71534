/* libFuzzer target: dt_dataset_load_image_folder on root/cls/img.png. Input: 1 byte P, then the image
   file. P picks the output: channels 1 (bit 0 set) or 3, h = 1 + bits 1..3, w = 1 + bits 4..6.
   To let the fuzzer see inside stb_image's decoders too, build it with stb_image compiled in:
       clang -std=c11 -O1 -g -fsanitize=fuzzer,address -DSTB_IMAGE_IMPLEMENTATION
           -DSTB_IMAGE_RESIZE_IMPLEMENTATION -DDT_USE_ZLIB -DDT_USE_STB_IMAGE fuzz/fuzz_image.c -lz -lm */
#include "fuzz_util.h"
#define DT_IMAGE_MAX_PIXELS (1 << 20)   /* keeps each run fast; the limit itself is part of what is tested */
#define DTRAIN_IMPLEMENTATION
#include "../dtrain.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    dt_dataset ds;
    int64_t ch, h, w;
    if (size < 1) return 0;
    ch = (data[0] & 1) ? 1 : 3;
    h = 1 + ((data[0] >> 1) & 7);
    w = 1 + ((data[0] >> 4) & 7);
    fz_mkdir("root");
    fz_mkdir("root/cls");
    fz_write("root/cls/img.png", data + 1, size - 1);
    fz_check(dt_dataset_load_image_folder(&ds, fz_path("root"), h, w, ch), &ds);
    dt_dataset_free(&ds);
    return 0;
}
