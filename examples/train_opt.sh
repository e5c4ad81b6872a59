#!/usr/bin/env bash
# Train a model on a plan with sailor's runtime.
#
#   No GPU: a small OPT (the `tiny` preset: 4 blocks, hidden 64) on CPU, on a
#   heterogeneous plan: stage 0 (embedding + 2 blocks) on TP 2, stage 1
#   (2 blocks + head) on TP 1, two replicas with microbatch sizes 2 and 1.
#   Two stages x two replicas with a TP-2 stage need 2*2 + 2*1 = 6 processes.
#   GPUs: a LLaMA-shaped model in bf16 on all local GPUs (TP 2 where there are
#   >= 2 GPUs, the rest data parallel), sequence 2048: by default a fresh
#   1.1B model of TinyLlama's shape; MODEL=DIR trains your Hugging Face model
#   directory instead, from its weights when it has safetensors.
#
# Environment: DEVICE (auto, cpu or gpu), PYTHON (default .venv/bin/python or python3), OUT (out/train_opt),
# ITERS (steps), MASTER_PORT (29500), DATA_TEXT (a text or JSONL file to train on, tokenized by
# `sailor data prepare` with TOKENIZER: a tokenizer.json or model directory, default byte-level;
# default data: synthetic sequences), MODEL and GPU_TYPE (the plan's GPU label, default H100-80).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
OUT=${OUT:-out/train_opt}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

DATA_ARGS=()
if [ -n "${DATA_TEXT:-}" ]; then
  "$PYTHON" -m planner.cli data prepare "$DATA_TEXT" --tokenizer "${TOKENIZER:-bytes}" -o "$OUT/corpus"
  DATA_ARGS=(--data-path "$OUT/corpus")
fi

DEVICE=${DEVICE:-auto}
if [ "$DEVICE" = gpu ] || { [ "$DEVICE" = auto ] && command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }; then
  NGPU=$(nvidia-smi -L | wc -l)
  if [ -z "${MODEL:-}" ]; then  # a 1.1B LLaMA of TinyLlama's shape, from random weights
    MODEL="$OUT/llama-1.1b"
    mkdir -p "$MODEL"
    cat > "$MODEL/config.json" <<'JSON'
{"model_type": "llama", "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 22,
 "num_attention_heads": 32, "num_key_value_heads": 4, "vocab_size": 32000, "max_position_embeddings": 2048,
 "rope_theta": 10000.0, "rms_norm_eps": 1e-05, "hidden_act": "silu", "tie_word_embeddings": false}
JSON
  fi
  "$PYTHON" - "$OUT/plan.json" "$NGPU" "$MODEL" "${GPU_TYPE:-H100-80}" <<'PY'
import sys
from planner.launch import uniform_plan
from planner.specs.model import get_model
from planner.specs.plan import save_plan

path, n, model, gpu = sys.argv[1], int(sys.argv[2]), get_model(sys.argv[3], seq_len=2048), sys.argv[4]
tp = 2 if n >= 2 else 1
dp = n // tp
plan = uniform_plan(model, tp * dp, tp=tp, pp=1, global_batch_size=32 * dp, micro_batch_size=4, gpu=gpu,
                    zone="local")
save_plan(plan, path)
print(f"plan: {model.name} ({model.total_params(padded=False) / 1e9:.2f} B parameters) on {tp * dp} GPUs, "
      f"TP {tp} x DP {dp}, global batch {plan.global_batch_size}, sequence {model.seq_len}, bf16")
PY
  ITERS=${ITERS:-200}
  WARMUP=$(( ITERS >= 200 ? 20 : ITERS / 10 ))  # (the decay starts after the warm-up and ends at ITERS)
  ARGS=(--train-iters "$ITERS" --lr 3e-4 --min-lr 3e-5 --lr-warmup-iters "$WARMUP" --lr-decay-style cosine
        --lr-decay-iters "$ITERS" --bf16 --save "$OUT/ckpt" --save-interval 100)
  if compgen -G "$MODEL/*.safetensors" >/dev/null; then ARGS+=(--load-hf "$MODEL"); fi
else
  cat > "$OUT/plan.json" <<'JSON'
{"format": "sailor-plan", "version": 1, "model": "tiny", "global_batch_size": 12,
 "stages": [{"layers": [0, 2], "replicas": [{"gpu": "CPU", "tp": 2, "zone": "local", "count": 2}]},
            {"layers": [3, 5], "replicas": [{"gpu": "CPU", "tp": 1, "zone": "local", "count": 2}]}],
 "pipelines": [{"microbatch_size": 2, "num_microbatches": 4},
               {"microbatch_size": 1, "num_microbatches": 4}]}
JSON
  ITERS=${ITERS:-40}
  ARGS=(--train-iters "$ITERS" --lr 3e-3 --lr-warmup-iters 5 --save "$OUT/ckpt" --save-interval 20)
fi

rm -rf "$OUT/metrics.jsonl" "$OUT/ckpt"  # a fresh run (the runtime refuses to save over another run's checkpoints)
"$PYTHON" -m planner.cli launch "$OUT/plan.json" --local --master-port "${MASTER_PORT:-29500}" -- "${ARGS[@]}" ${DATA_ARGS[@]+"${DATA_ARGS[@]}"} \
  --metrics-file "$OUT/metrics.jsonl" --log-interval 5
echo "metrics: $OUT/metrics.jsonl, checkpoint: $OUT/ckpt"
