#!/usr/bin/env bash
# The GPU checks of the analysis (issue 4), as the one prepared script a session
# lent a device machine runs there (the `device` tool's `run`). python3 on that
# machine holds a CUDA build of torch, pandas, numpy, safetensors, transformers,
# scikit-learn and pytest, but no duckdb: it travels as a wheel. Here, once:
#
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 -d .whl \
#       duckdb==$(.venv/bin/pip show duckdb | awk '/^Version/{print $2}')
#
# then run(command="bash scripts/gpu_check.sh", carry=[".whl"], timeout_s=600) and
# read the files it leaves in $OUT: env.txt, gpu_tests.txt (the `-m gpu` tests),
# gpu_compare.txt (every metric of three demo checkpoints, CPU against CUDA),
# analysis_speed_cuda.txt (the Llama-1B bench on the GPU, naive version
# included), analysis_7b_cuda.txt (the Llama-2-7B-shaped bench, 32 layers MHA,
# 4.3 GB, against its floor: the same phases as on the CPU), analysis_scaling_cuda.txt
# (each phase's exponent in d_model, MHA vs GQA), forward_speed_cuda.txt (the activation
# job's tokens/s against the plain forward, demo and a ~100M Llama) and analysis_speed_cpu.txt (the
# Llama-1B bench on that machine's CPU cores, for the CPU target on more than
# two cores). The 7B step writes a 4.3 GB folder first (~1.5 min on 2 cores);
# not yet run on a GPU machine with it: give it timeout_s=600.
# It runs here too (no CUDA: the gpu tests skip, the rest says why it stops).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/qkvscope-gpu-check}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
if ls .whl/*.whl >/dev/null 2>&1; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} || exit 1
fi
status=0
{
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 || true
    nproc
    $PY -c "import torch, duckdb; print('torch', torch.__version__, 'duckdb', duckdb.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else '-')"
} 2>&1 | tee "$OUT/env.txt" || status=1
$PY -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 3)"
cuda=$?
$PY -m pytest -q -m gpu -p no:cacheprovider tests/analysis tests/experiments 2>&1 | tee "$OUT/gpu_tests.txt" || status=1
if [ "$cuda" = 0 ]; then
    $PY scripts/gpu_compare.py --device cuda 2>&1 | tee "$OUT/gpu_compare.txt" || status=1
    $PY bench/analysis_speed.py --device cuda --naive-layers 2 --repeat 3 --dir /tmp/qkvscope-bench-ckpt \
        2>&1 | tee "$OUT/analysis_speed_cuda.txt" || status=1
    $PY bench/analysis_speed.py --device cuda --shape 7B --skip-naive --repeat 1 --dir /tmp/qkvscope-bench-7b \
        2>&1 | tee "$OUT/analysis_7b_cuda.txt" || status=1
    $PY bench/analysis_scaling.py --device cuda --dir /tmp/qkvscope-bench-scaling \
        2>&1 | tee "$OUT/analysis_scaling_cuda.txt" || status=1
    $PY bench/forward_speed.py --device cuda \
        2>&1 | tee "$OUT/forward_speed_cuda.txt" || status=1
else
    echo "no CUDA device: gpu_compare and the CUDA bench are skipped" | tee "$OUT/gpu_compare.txt"
fi
$PY bench/analysis_speed.py --device cpu --skip-naive --repeat 3 --dir /tmp/qkvscope-bench-ckpt \
    2>&1 | tee "$OUT/analysis_speed_cpu.txt" || status=1
exit $status
