#!/usr/bin/env python3
"""tools/experiments/cifar_from_fmnist.py OUT_DIR NTRAIN NTEST [FMNIST_DIR] - a CIFAR-10-format copy of
Fashion-MNIST, for the workloads written for CIFAR-10 (ResNet-20, VGG-11) on a machine without it: the first
NTRAIN training and NTEST test images, each zero-padded from 28x28 to 32x32 and repeated in the R, G and B
planes, written as data_batch_1.bin .. data_batch_5.bin (NTRAIN split over the five), test_batch.bin and
batches.meta.txt (the class names). It is Fashion-MNIST in CIFAR-10's file format, not CIFAR-10: accuracies
on it say nothing about CIFAR-10. FMNIST_DIR defaults to /usr/share/datasets/fashion-mnist (dataset-fashion-mnist)."""
import gzip, os, struct, sys

CLASSES = ["t-shirt", "trouser", "pullover", "dress", "coat", "sandal", "shirt", "sneaker", "bag", "ankle-boot"]


def read_idx(path, magic):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    if struct.unpack(">I", data[:4])[0] != magic:
        sys.exit("%s: not an IDX file of magic %d" % (path, magic))
    return data


def find(d, stem):
    for name in (stem, stem + ".gz"):
        if os.path.exists(os.path.join(d, name)):
            return os.path.join(d, name)
    sys.exit("no %s(.gz) in %s: install dataset-fashion-mnist (tools/deps.sh) or pass its directory" % (stem, d))


def records(d, prefix, n):
    img = read_idx(find(d, prefix + "-images-idx3-ubyte"), 2051)
    lab = read_idx(find(d, prefix + "-labels-idx1-ubyte"), 2049)
    count = struct.unpack(">I", img[4:8])[0]
    if n > count:
        sys.exit("asked for %d images; %s has %d" % (n, prefix, count))
    out = bytearray()
    for i in range(n):
        px = img[16 + 784 * i: 16 + 784 * (i + 1)]
        plane = bytearray(1024)   # 32x32, the 28x28 image at row 2, column 2
        for r in range(28):
            plane[32 * (r + 2) + 2: 32 * (r + 2) + 30] = px[28 * r: 28 * (r + 1)]
        out += bytes([lab[8 + i]]) + plane * 3
    return out


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    out, ntrain, ntest = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    src = sys.argv[4] if len(sys.argv) > 4 else "/usr/share/datasets/fashion-mnist"
    if ntrain < 5 or ntest < 1:
        sys.exit("NTRAIN must be at least 5 (one image per training batch file) and NTEST at least 1")
    os.makedirs(out, exist_ok=True)
    train = records(src, "train", ntrain)
    cuts = [ntrain * k // 5 for k in range(6)]
    for k in range(5):
        with open(os.path.join(out, "data_batch_%d.bin" % (k + 1)), "wb") as f:
            f.write(train[3073 * cuts[k]: 3073 * cuts[k + 1]])
    with open(os.path.join(out, "test_batch.bin"), "wb") as f:
        f.write(records(src, "t10k", ntest))
    with open(os.path.join(out, "batches.meta.txt"), "w") as f:
        f.write("\n".join(CLASSES) + "\n")


if __name__ == "__main__":
    main()
