#!/usr/bin/env bash
# The GPU checks in one command, within 10 minutes on one GPU: the CUDA test suite (tests/gpu, NCCL, bf16,
# fp16, ranks sharing the GPU through gloo, strict device mode) and bench/gpu_step.py (our step time and MFU
# against megatron-core's own GPTModel on a ~1.1 B LLaMA-shaped model, bf16, sequence 2048; JSON).
# Both parts ran on one H100 on 2026-11-25 (bench/results/h100-2026-11-25).
#   PYTHON=.venv/bin/python    the interpreter (default: the checkout's .venv)
#   BENCH_ARGS="--steps 5"     extra arguments for the bench
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
if ! "$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "tools/gpu_check.sh: no CUDA GPU visible to torch; nothing to check" >&2
    exit 2
fi
"$PYTHON" -c "import torch; print('gpu_check:', torch.cuda.get_device_name(0), 'torch', torch.__version__)"
status=0
timeout 330 "$PYTHON" -m pytest -q -m cuda tests/gpu -p no:cacheprovider || status=$?
# shellcheck disable=SC2086  # BENCH_ARGS is a list of words
timeout 240 "$PYTHON" bench/gpu_step.py ${BENCH_ARGS:-} || status=$?
exit $status
