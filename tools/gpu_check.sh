#!/usr/bin/env bash
# The GPU checks in one command, within 10 minutes on one GPU: the CUDA test suite (tests/gpu, NCCL, bf16,
# fp16, ranks sharing the GPU through gloo, strict device mode, no host sync in a step; about 3 minutes on an
# H100), bench/gpu_step.py (our step time and MFU against megatron-core's own GPTModel on a ~1.1 B
# LLaMA-shaped model, bf16, sequence 2048; JSON; about 1.5 minutes) and bench/sim_vs_real_gpu.py (profile,
# plan, simulate and run that model on this GPU: the simulator's step-time and peak-memory error; JSON;
# about 3.5 minutes with the four plans below, estimated from the six-plan run, about 5 minutes).
# Both first parts ran on one H100 on 2026-11-25 (bench/results/h100-2026-11-25); the third ran there with
# microbatches 1,2,4 (six plans).
#   PYTHON=.venv/bin/python    the interpreter (default: the checkout's .venv)
#   BENCH_ARGS="--steps 5"     extra arguments for bench/gpu_step.py
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
if ! "$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "tools/gpu_check.sh: no CUDA GPU visible to torch; nothing to check" >&2
    exit 2
fi
"$PYTHON" -c "import torch; print('gpu_check:', torch.cuda.get_device_name(0), 'torch', torch.__version__)"
status=0
timeout 200 "$PYTHON" -m pytest -q -m cuda tests/gpu -p no:cacheprovider || status=$?
# shellcheck disable=SC2086  # BENCH_ARGS is a list of words
timeout 120 "$PYTHON" bench/gpu_step.py ${BENCH_ARGS:-} || status=$?
timeout 270 "$PYTHON" bench/sim_vs_real_gpu.py --micro-batch-sizes 1,4 --steps 5 --warmup 2 || status=$?
exit $status
