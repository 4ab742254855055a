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
# read the files it leaves in $OUT (eight: what the tool brings back), in the order the steps run,
# each step under its own time limit (600 s in all; STEPS below picks some): gpu_tests.txt (the
# machine, then the `-m gpu` tests: the float64-reference tests on ill-conditioned heads on
# CUDA, training on CUDA; and analysis._lapack_pool's tests on that machine's cores),
# gpu_compare.txt (every metric of three demo checkpoints, CPU against CUDA),
# small_decompositions_cuda.txt (one 7B-shaped layer profiled op by op with the d_head x d_head
# decompositions on the host, one problem per thread or one torch call per stack, and on the GPU;
# the host decompositions alone; one 1.1B-shaped layer on the CPU, pooled or not:
# scripts/layer_profile.py --pool --micro), analysis_7b_cuda.txt (the Llama-2-7B-shaped bench, 32
# layers MHA, 4.3 GB, against its floor: the same phases as on the CPU), analysis_speed_cpu.txt
# (the Llama-1B bench on that machine's CPU cores), analysis_speed_cuda.txt (the Llama-1B bench
# on the GPU, the naive version on one layer), forward_speed_cuda.txt (the activation job's
# tokens/s against the plain forward, 8 demo checkpoints and a ~100M Llama) and
# analysis_scaling_cuda.txt (each phase's exponent in d_model, MHA vs GQA).
# It runs here too (no CUDA: the gpu tests skip, the rest says why it stops).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/qkvscope-gpu-check}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
# a step past its limit gets SIGABRT first: every Python process in it prints where each of its
# threads stood (faulthandler), then SIGKILL 10 s later
export PYTHONFAULTHANDLER=1
PY=${PYTHON:-python3}
if ls .whl/*.whl >/dev/null 2>&1; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} || exit 1
fi
status=0
# Each step runs under its own `timeout` (seconds), most important first, so that one call of
# at most 600 s returns every file that finished: the GPU tests and the CPU-against-CUDA check
# (is CUDA right?) before the timings (how fast?). STEPS picks steps for a rerun, e.g.
# STEPS="scaling cpu" bash scripts/gpu_check.sh.
STEPS=${STEPS:-"tests compare eig 7b cpu 1b forward scaling"}
want() { case " $STEPS " in *" $1 "*) return 0;; *) return 1;; esac; }
step() {   # step NAME SECONDS FILE COMMAND...: the command's output to the screen and $OUT/FILE
    local name=$1 limit=$2 file=$3; shift 3
    want "$name" || return 0
    echo "== $name (at most ${limit} s): $*" | tee -a "$OUT/$file"
    local t0=$SECONDS
    timeout --signal=ABRT --kill-after=10 "$limit" "$@" 2>&1 | tee -a "$OUT/$file"
    local rc=${PIPESTATUS[0]}
    echo "== $name: exit $rc after $((SECONDS - t0)) s" | tee -a "$OUT/$file"
    [ "$rc" = 0 ] || status=1
}
rm -f "$OUT"/*.txt
{
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 || true
    nproc
    $PY -c "import torch, duckdb, transformers; print('torch', torch.__version__, 'duckdb', duckdb.__version__, 'transformers', transformers.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else '-')"
} 2>&1 | tee "$OUT/gpu_tests.txt" || status=1
$PY -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 3)"
cuda=$?
step tests 75 gpu_tests.txt bash -c "$PY -m pytest -q -m gpu -p no:cacheprovider tests/analysis tests/experiments && \
    $PY -m pytest -q -p no:cacheprovider tests/analysis/test_lapack_pool.py"
if [ "$cuda" = 0 ]; then
    step compare 30 gpu_compare.txt $PY scripts/gpu_compare.py --device cuda
    step eig 75 small_decompositions_cuda.txt bash -c "$PY scripts/layer_profile.py --shape 7B --device cuda ${EIG_ARGS:---pool --micro} && \
        $PY scripts/layer_profile.py --shape 1.1B --device cpu --pool --rows 10"
    step 7b 100 analysis_7b_cuda.txt $PY bench/analysis_speed.py --device cuda --shape 7B --skip-naive --repeat 1 \
        --dir /tmp/qkvscope-bench-7b
    for threads in ${CPU_THREADS:-0}; do             # CPU_THREADS="4 16": the CPU bench at those torch threads
        step cpu 60 analysis_speed_cpu.txt $PY bench/analysis_speed.py --device cpu --skip-naive --repeat 1 \
            --dir /tmp/qkvscope-bench-ckpt --threads "$threads"
    done
    step 1b 50 analysis_speed_cuda.txt $PY bench/analysis_speed.py --device cuda --skip-naive --repeat 1 \
        --dir /tmp/qkvscope-bench-ckpt
    step forward 100 forward_speed_cuda.txt $PY bench/forward_speed.py --device cuda ${FORWARD_ARGS:---limit 8}
    step scaling 110 analysis_scaling_cuda.txt $PY bench/analysis_scaling.py --device cuda --dir /tmp/qkvscope-bench-scaling
else
    echo "no CUDA device: gpu_compare and the CUDA bench are skipped" | tee "$OUT/gpu_compare.txt"
    step cpu 60 analysis_speed_cpu.txt $PY bench/analysis_speed.py --device cpu --skip-naive --repeat 1 \
        --dir /tmp/qkvscope-bench-ckpt
fi
exit $status
