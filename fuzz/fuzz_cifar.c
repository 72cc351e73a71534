/* libFuzzer target: dt_dataset_load_cifar10 (test set). Input: 1 byte M, then M bytes of batches.meta.txt
   (no such file when M is 0), then test_batch.bin. */
#include "fuzz_util.h"
#define DTRAIN_IMPLEMENTATION
#include "../dtrain.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    dt_dataset ds;
    size_t m;
    if (size < 1) return 0;
    m = data[0];
    if (m > size - 1) m = size - 1;
    fz_mkdir("c");
    if (m) fz_write("c/batches.meta.txt", data + 1, m);
    else unlink(fz_path("c/batches.meta.txt"));
    fz_write("c/test_batch.bin", data + 1 + m, size - 1 - m);
    fz_check(dt_dataset_load_cifar10(&ds, fz_path("c"), 0), &ds);
    dt_dataset_free(&ds);
    return 0;
}
