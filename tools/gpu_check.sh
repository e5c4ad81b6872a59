#!/usr/bin/env bash
# The GPU checks in one command, within 10 minutes on one GPU: the CUDA test suite (tests/gpu, NCCL, bf16,
# fp16, ranks sharing the GPU through gloo, compiled kernels, strict device mode, no host sync in a step),
# bench/gpu_step.py (our step time and MFU against megatron-core's own GPTModel on a ~1.1 B LLaMA-shaped
# model, bf16, sequence 2048; JSON) and bench/sim_vs_real_gpu.py (profile, plan, simulate and run that model
# on this GPU: the simulator's step-time and peak-memory error; JSON). On one H100 on 2026-11-27 the whole
# ran in 353 s: the suite 67 s (4 at a time), the two benchmarks together about 4.7 minutes
# (bench/results/h100-2026-11-27).
#   PYTHON=.venv/bin/python    the interpreter (default: the checkout's .venv)
#   BENCH_ARGS="--steps 5"     extra arguments for bench/gpu_step.py
#   RESULTS=DIR                also keep each part's output there: pytest_cuda.log, gpu_step.json,
#                              sim_vs_real_gpu.json (and their stderr as *.err)
# With pytest-xdist installed the suite runs 4 tests at a time (each test is a few small processes).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
if ! "$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "tools/gpu_check.sh: no CUDA GPU visible to torch; nothing to check" >&2
    exit 2
fi
RESULTS=${RESULTS:-}
if [ -n "$RESULTS" ]; then mkdir -p "$RESULTS"; fi
# part NAME LIMIT COMMAND...: run under a time limit; with RESULTS, stdout to RESULTS/NAME, stderr to NAME.err too
part() {
    local name=$1 limit=$2 start=$SECONDS rc=0; shift 2
    echo "gpu_check: $name (limit ${limit} s)" >&2
    if [ -n "$RESULTS" ]; then
        timeout "$limit" "$@" > >(tee "$RESULTS/$name") 2> >(tee "$RESULTS/$name.err" >&2) || rc=$?
    else
        timeout "$limit" "$@" || rc=$?
    fi
    echo "gpu_check: $name took $((SECONDS - start)) s, exit $rc" >&2
    return $rc
}
"$PYTHON" -c "import torch; print('gpu_check:', torch.cuda.get_device_name(0), 'torch', torch.__version__)"
parallel=()
if "$PYTHON" -c "import xdist" 2>/dev/null; then parallel=(-n 4); fi
status=0
part pytest_cuda.log 200 "$PYTHON" -m pytest -q -m cuda tests/gpu -p no:cacheprovider \
    ${parallel[@]+"${parallel[@]}"} || status=$?
# shellcheck disable=SC2086  # BENCH_ARGS is a list of words
part gpu_step.json 120 "$PYTHON" bench/gpu_step.py ${BENCH_ARGS:-} || status=$?
part sim_vs_real_gpu.json 270 "$PYTHON" bench/sim_vs_real_gpu.py --micro-batch-sizes 1,4 --steps 5 --warmup 2 \
    || status=$?
exit $status
