#!/bin/sh
# bench/cuda.sh - training-step throughput on the GPU: dtrain's GPU backend (make CUDA=1) against PyTorch on
# the same GPU, side by side in one run (make bench-cuda).
#
# usage: sh bench/cuda.sh [BUILD]      BUILD: the CUDA=1 build folder (default build-cuda)
# environment: MODELS (default "simplecnn resnet20 vgg11"), BATCHES (default "128 512"), WINDOWS (5),
#              ITERS (20), PYTHON (python3 with a CUDA PyTorch; default /usr/bin/python3, else python3)
#
# Per model and batch, images per second (median of WINDOWS windows of ITERS steps after 5 warm-up steps):
#   dtrain managed   dt_cuda_create's default: managed memory (the trainers' host code may touch the buffers)
#   dtrain device    DT_CUDA_MEMORY=device: plain cudaMalloc
#   torch fp32       PyTorch, TF32 off (full fp32, as dtrain)
#   torch tf32       PyTorch with TF32 matrix products and convolutions (dtrain has no TF32 mode)
# and the ratio of dtrain's better memory kind to PyTorch fp32. dtrain uploads each step's batch from host
# memory (as training does); PyTorch's batch stays on the GPU. A "-" is a run that failed (its error is on
# stderr).
B=${1:-build-cuda}
MODELS=${MODELS:-simplecnn resnet20 vgg11}
BATCHES=${BATCHES:-128 512}
WINDOWS=${WINDOWS:-5}
ITERS=${ITERS:-20}
if [ -z "$PYTHON" ]; then
    if [ -x /usr/bin/python3 ] && /usr/bin/python3 -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
        PYTHON=/usr/bin/python3
    else PYTHON=python3; fi
fi
if [ ! -x "$B/bench/bench_models" ]; then
    echo "bench/cuda.sh: $B/bench/bench_models is missing: build it with make CUDA=1 $B/bench/bench_models" >&2
    exit 1
fi
# the 5th field of the CSV line: the median images per second
rate() { "$@" | tail -n 1 | cut -d, -f5 | grep . || echo -; }
printf '%-10s %5s %15s %14s %11s %11s %7s\n' model batch "dtrain managed" "dtrain device" "torch fp32" "torch tf32" ratio
for m in $MODELS; do
    for b in $BATCHES; do
        a="--model $m --batch $b --warmup 5 --iters $ITERS --windows $WINDOWS"
        dm=$(rate env DT_CUDA_MEMORY=managed "$B/bench/bench_models" $a)
        dd=$(rate env DT_CUDA_MEMORY=device "$B/bench/bench_models" $a)
        tf=$(rate "$PYTHON" bench/torch_models.py $a --device cuda)
        tt=$(rate "$PYTHON" bench/torch_models.py $a --device cuda --tf32)
        r=$(awk -v a="$dm" -v b="$dd" -v t="$tf" 'BEGIN { d = (a == "-") ? 0 : a; if (b != "-" && b + 0 > d) d = b;
            if (t == "-" || t + 0 <= 0 || d <= 0) print "-"; else printf "%.2fx", d / t }')
        printf '%-10s %5s %15s %14s %11s %11s %7s\n' "$m" "$b" "$dm" "$dd" "$tf" "$tt" "$r"
    done
done
