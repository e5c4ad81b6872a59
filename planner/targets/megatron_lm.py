"""Stock Megatron-LM: the `pretrain_gpt.py` command that trains a plan's model the way sailor's runtime would.

Megatron-LM runs one GPU type, one TP degree, one microbatch size and count
for every replica, and recomputes on every stage or none; a plan outside
that has no equivalent and is refused with the reason. Inside it, the
command carries the model's architecture (LLaMA: RMSNorm, SwiGLU, RoPE,
GQA, no biases), the plan's layer split (`--decoder-first/last-pipeline-num-
layers` when the middle stages are equal, else `--pipeline-model-parallel-
layout`), and the training arguments given after `--` (sailor_ext.train's
names are Megatron's), with sailor's defaults where Megatron's differ, so
both runtimes train the same way. Without --data-path it trains on
Megatron's mock data; the tokenizer is Megatron's NullTokenizer of the
model's vocabulary (token ids are read as they are, as sailor does).
"""
from __future__ import annotations

import argparse
import math
import shlex

from planner.errors import SailorError
from planner.flags import Parser, UsageError
from planner.targets import per_node

def megatron_model_args(model) -> list[str]:
    """Megatron-LM's arguments for the architecture of `model` beyond its sizes (defaults: GPT's)."""
    def refuse(what: str) -> None:
        raise SailorError(f"{model.name} uses {what}, which stock Megatron-LM's arguments cannot express; train it "
                          "with sailor's runtime")

    if model.latent or model.router_sigmoid or model.dense_blocks:  # (Megatron-LM has flags for them; not mapped)
        raise SailorError(f"{model.name} uses latent attention, a sigmoid router or dense blocks among the experts' "
                          "(DeepSeek's, Llama 4's), which sailor does not map onto Megatron-LM's arguments; train it "
                          "with sailor's runtime")
    if model.post_norm:
        refuse("a norm after each residual add (post-LN)")
    if model.projected:
        refuse(f"a {model.word_dim}-wide word embedding projected to {model.hidden}")
    if any(model.windows):
        refuse("sliding-window attention")
    if model.attention_scale:
        refuse(f"attention scaled by {model.attention_scale:g} instead of 1/sqrt(head_dim)")
    if not model.final_norm:
        refuse("no norm before the head")
    for present, what in ((model.linear_blocks, "Gated DeltaNet (linear attention) blocks"),
                          (model.attention_gate, "an output gate on attention"),
                          (model.parallel_residual, "attention and MLP side by side (parallel residual)"),
                          (model.qk_norm_after_rotary, "q/k norms after the rotary positions"),
                          (model.qk_norm, "per-head q/k norms"),
                          (model.rotary_fraction < 1, f"rotary positions on {model.rotary_fraction:g} of each head"),
                          (model.norm_offset, "norms that scale by (1 + w)"),
                          (model.embedding_multiplier != 1,
                           f"word embeddings scaled by {model.embedding_multiplier:g}"),
                          (model.residual_multiplier != 1,
                           f"residual branches scaled by {model.residual_multiplier:g}"),
                          (model.logits_divisor != 1, f"logits divided by {model.logits_divisor:g}"),
                          (model.sandwich_norm, "a norm on each sublayer's output (sandwich norms)"),
                          (model.attn_softcap or model.logit_softcap, "soft caps on attention scores or logits"),
                          (model.local_rope_theta, "a rotary base of its own on the windowed blocks"),
                          (not model.norm_weight, "norms without weights"),
                          (not model.rms_norm and not model.norm_bias, "LayerNorms without bias"),
                          (model.rotary_interleaved, "rotary positions on adjacent pairs of dimensions"),
                          (model.nope_blocks, "blocks without rotary positions (NoPE)"),
                          (model.query_scale_beta, "a query scale that grows with the position"),
                          (model.qk_l2_norm, "q/k norms without weights"),
                          (model.qkv_clip, f"q, k and v clamped to {model.qkv_clip:g} (clip_qkv)"),
                          (model.embedding_norm, "a norm on the embeddings"),
                          (model.rotary_reversed, "rotary positions turned the other way"),
                          (model.alibi, "ALiBi attention biases"),
                          (model.attention_chunk, "chunked attention"),
                          (model.expert_input_weighted, "experts whose input is weighted by the router"),
                          (model.attention_sinks, "attention sinks"), (model.head_bias, "a bias on the output layer"),
                          (model.router_bias, "a bias on the router"),
                          (model.experts and model.mlp_bias, "biases on the experts' linears"),
                          (model.glu_limit, "the clamped GLU of gpt-oss's experts")):
        if present:
            refuse(what)
    args = []
    if model.rms_norm:
        args.append("--normalization RMSNorm")
    if model.norm_eps != 1e-5:
        args.append(f"--norm-epsilon {model.norm_eps:g}")
    if model.gated_mlp and model.activation == "silu":
        args.append("--swiglu")
    elif model.gated_mlp or model.activation not in ("gelu", "gelu_tanh"):
        refuse(f"a{' gated' if model.gated_mlp else ''} {model.activation} MLP")
    elif model.activation == "gelu_tanh":
        args.append("--openai-gelu")
    if not model.learned_positions:
        args += ["--position-embedding-type rope", f"--rotary-base {model.rope_theta:g}"]
        scaling = dict(model.rope_scaling)
        if scaling.get("type") == "linear" and float(scaling["factor"]).is_integer():
            args.append(f"--rotary-seq-len-interpolation-factor {int(scaling['factor'])}")
        elif scaling.get("type") == "llama3" and (scaling["low_freq_factor"], scaling["high_freq_factor"],
                                                  scaling["original_max_position_embeddings"]) == (1, 4, 8192):
            args += ["--use-rope-scaling", f"--rotary-scaling-factor {scaling['factor']:g}"]
        elif scaling and scaling["type"] != "dynamic":  # (dynamic NTK: the default frequencies inside the context,
            # which the sequence never passes)
            refuse(f"rotary scaling {scaling['type']}")
    if model.num_query_groups != model.heads:
        args += ["--group-query-attention", f"--num-query-groups {model.num_query_groups}"]
    if model.head_dim_override:
        args.append(f"--kv-channels {model.head_dim}")
    biases = (model.qkv_bias, model.out_bias, model.mlp_bias)
    if biases == (True, False, False):
        args += ["--disable-bias-linear", "--add-qkv-bias"]
    elif biases == (False, False, False):
        args.append("--disable-bias-linear")
    elif biases != (True, True, True):
        refuse("biases on some linear layers only")
    if model.experts:
        # Megatron's router: top k of the logits, then their softmax (the renormalised probabilities), or with
        # --moe-router-pre-softmax the top k of the softmax (its load balancing: training_args)
        args += [f"--num-experts {model.experts}", f"--moe-router-topk {model.experts_per_token}",
                 f"--moe-ffn-hidden-size {model.ffn_hidden}"]
        if not model.expert_renorm:
            args.append("--moe-router-pre-softmax")
        if model.shared_expert_ffn:  # Qwen2-MoE's behind its sigmoid gate; GraniteMoeShared's without
            args.append(f"--moe-shared-expert-intermediate-size {model.shared_expert_ffn}")
            if model.shared_expert_gated:
                args.append("--moe-shared-expert-gate")
    if not model.tied_embeddings:
        args.append("--untie-embeddings-and-output-weights")
    return args


def _train_options() -> argparse.ArgumentParser:
    """sailor_ext.train's options that Megatron-LM takes too, with sailor's defaults (no torch import)."""
    p = Parser(prog="sailor launch --target megatron-lm", add_help=False, allow_abbrev=False)  # one-line errors
    p.add_argument("--train-iters", type=int)
    for name, default in (("--lr", 1e-3), ("--min-lr", 0.0), ("--weight-decay", 0.01), ("--adam-beta1", 0.9),
                          ("--adam-beta2", 0.95), ("--adam-eps", 1e-8), ("--clip-grad", 1.0),
                          ("--sgd-momentum", 0.9)):
        p.add_argument(name, type=float, default=default)
    for name in ("--lr-warmup-iters", "--lr-decay-iters", "--save-interval", "--eval-interval", "--eval-iters",
                 "--seq-length", "--global-batch-size", "--micro-batch-size"):
        p.add_argument(name, type=int)
    p.add_argument("--lr-decay-style", default="constant")
    p.add_argument("--optimizer", default="adam")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--moe-aux-loss-coeff", type=float, default=0.0)
    p.add_argument("--moe-z-loss-coeff", type=float, default=0.0)
    p.add_argument("--log-interval", type=int, default=1)
    p.add_argument("--make-vocab-size-divisible-by", type=int, default=128)
    p.add_argument("--dist-timeout", type=float)
    p.add_argument("--data-path", nargs="+")
    p.add_argument("--split")
    p.add_argument("--mock-data", action="store_true")
    p.add_argument("--save")
    p.add_argument("--load")
    p.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--fp16", action="store_true")
    p.add_argument("--use-distributed-optimizer", action="store_true")
    p.add_argument("--overlap-grad-reduce", action=argparse.BooleanOptionalAction)
    p.add_argument("--no-bias-swiglu-fusion", action="store_true")
    p.add_argument("--no-rope-fusion", action="store_true")
    return p


EVAL_ITERS = 100  # sailor_ext.data.EVAL_ITERS, sailor's default --eval-iters (that module imports torch)

# sailor_ext.train options with no Megatron-LM counterpart, and why.
NOT_IN_MEGATRON = {
    "--plan": "the command is made from the plan already",
    "--model": "the command is made for the plan's model; make a plan for another model",
    "--cluster": "Megatron-LM takes no cluster file",
    "--load-hf": "Megatron-LM loads its own checkpoints; convert Hugging Face weights with its checkpoint converter",
    "--metrics-file": "Megatron-LM logs metrics to stdout, TensorBoard or W&B",
    "--keep-checkpoints": "Megatron-LM keeps every checkpoint",
    "--grad-bucket-numel": "use Megatron's --ddp-bucket-size",
    "--tensor-model-parallel-size": "the plan sets it",
    "--pipeline-model-parallel-size": "the plan sets it",
    "--gpu-type": "the plan sets it",
}


def training_args(train_args: list[str], plan, model) -> list[str]:
    """Megatron-LM's training, data and checkpoint arguments for sailor_ext.train's `train_args`."""
    for arg in train_args:
        reason = NOT_IN_MEGATRON.get(arg.split("=")[0])
        if reason:
            raise SailorError(f"{arg.split('=')[0]} does not go to Megatron-LM ({reason}); drop it")
    try:
        known, unknown = _train_options().parse_known_args(train_args)
    except UsageError as e:  # e.reason: "argument --train-iters: invalid int value: 'abc'"
        raise SailorError(f"bad training arguments after '--': {e.reason}") from None
    if unknown:
        raise SailorError(f"sailor launch --target megatron-lm: unknown training argument {unknown[0]!r}")
    a = known
    if a.train_iters is None:
        raise SailorError("Megatron-LM needs the number of steps: add -- --train-iters N")
    if a.seq_length not in (None, model.seq_len):
        raise SailorError(f"--seq-length {a.seq_length} contradicts the plan's {model.seq_len}; drop the flag")
    if a.global_batch_size not in (None, plan.global_batch_size) or \
            a.micro_batch_size not in (None, plan.pipelines[0].microbatch_size):
        raise SailorError("--global-batch-size/--micro-batch-size contradict the plan; drop them")
    out = [f"--train-iters {a.train_iters}", f"--optimizer {a.optimizer}", f"--lr {a.lr:g}", f"--min-lr {a.min_lr:g}",
           f"--weight-decay {a.weight_decay:g}", f"--clip-grad {a.clip_grad:g}",
           f"--seed {a.seed}", f"--log-interval {a.log_interval}",
           f"--make-vocab-size-divisible-by {a.make_vocab_size_divisible_by}"]
    if model.experts:  # sailor's load-balancing loss is Megatron's per-sequence one (sailor_ext/moe.py)
        out += [f"--moe-router-load-balancing-type seq_aux_loss --moe-aux-loss-coeff {a.moe_aux_loss_coeff:g}"
                if a.moe_aux_loss_coeff else "--moe-router-load-balancing-type none"]
        if a.moe_z_loss_coeff:
            out.append(f"--moe-z-loss-coeff {a.moe_z_loss_coeff:g}")
    if a.optimizer == "adam":
        out += [f"--adam-beta1 {a.adam_beta1:g}", f"--adam-beta2 {a.adam_beta2:g}", f"--adam-eps {a.adam_eps:g}"]
    else:
        out.append(f"--sgd-momentum {a.sgd_momentum:g}")
    # sailor decays the learning rate only with a --lr-decay-iters (0 or none: constant after the warm-up);
    # Megatron decays to --train-iters by default and asserts warm-up < decay iterations, constant style or not
    if a.lr_decay_style == "constant" or not a.lr_decay_iters:
        out.append("--lr-decay-style constant")
        if a.lr_warmup_iters and a.lr_warmup_iters >= a.train_iters:
            out.append(f"--lr-decay-iters {a.lr_warmup_iters + 1}")  # (unused by the constant style)
    else:
        out += [f"--lr-decay-style {a.lr_decay_style}", f"--lr-decay-iters {a.lr_decay_iters}"]
    for flag, value in (("--lr-warmup-iters", a.lr_warmup_iters), ("--save", a.save),
                        ("--save-interval", a.save_interval), ("--load", a.load)):
        if value is not None:
            out.append(f"{flag} {shlex.quote(str(value))}")
    if a.dist_timeout is not None:
        out.append(f"--distributed-timeout-minutes {max(1, math.ceil(a.dist_timeout / 60))}")
    if a.fp16:  # the plan's precision arrives as its flag (planner/specs/precision.launch_flags)
        out.append("--fp16")
    elif a.bf16:
        out.append("--bf16")
    if a.use_distributed_optimizer:
        out.append("--use-distributed-optimizer")
    if a.overlap_grad_reduce:  # Megatron's default is off, ours on: passed where the flag is given
        out.append("--overlap-grad-reduce")
    out += [flag for flag, off in (("--no-bias-swiglu-fusion", a.no_bias_swiglu_fusion),
                                   ("--no-rope-fusion", a.no_rope_fusion)) if off]
    # sailor validates only when asked (Megatron would every 1000 steps): every --eval-interval steps, or with
    # --eval-iters alone once after the last step (an interval past the end: Megatron's end-of-training pass)
    if a.eval_interval:
        out += [f"--eval-interval {a.eval_interval}",
                f"--eval-iters {EVAL_ITERS if a.eval_iters is None else a.eval_iters}"]
    elif a.eval_iters:
        out += [f"--eval-interval {a.train_iters + 1}", f"--eval-iters {a.eval_iters}"]
    else:
        out.append("--eval-iters 0")
    if a.data_path:
        out += ["--data-path " + " ".join(shlex.quote(p) for p in a.data_path), f"--split {a.split or '969,30,1'}"]
    else:
        out.append("--mock-data")
    out += ["--tokenizer-type NullTokenizer", f"--vocab-size {model.vocab}"]
    return out


def split_args(plan, model) -> list[str]:
    """The plan's split of the transformer blocks over the pipeline stages, in Megatron's arguments."""
    blocks = [sum(model.kind(layer) == "block" for layer in s.layers) for s in plan.stages]
    pp = len(blocks)
    if pp == 1 or len(set(blocks)) == 1:
        return []  # Megatron's own even split
    middle = blocks[1:-1]
    if len(set(middle)) <= 1 and blocks[0] and blocks[-1]:
        return [f"--decoder-first-pipeline-num-layers {blocks[0]}", f"--decoder-last-pipeline-num-layers {blocks[-1]}"]
    stages = ["t" * n for n in blocks]
    stages[0], stages[-1] = "E" + stages[0], stages[-1] + "L"
    return [f"--pipeline-model-parallel-layout {shlex.quote('|'.join(stages))}"]


def megatron_lm(plan, model, layout, train_args: list[str], port: int = 29500) -> str:
    """A bash script that every node runs (NODE_RANK and MASTER_ADDR set) from a Megatron-LM checkout."""
    reps = {r for s in plan.stages for r in s.replicas}
    tps = {r.tp for r in reps}
    if len({r.gpu for r in reps}) != 1 or len(tps) != 1 or len(set(plan.pipelines)) != 1:
        raise SailorError("Megatron-LM runs one GPU type, one TP degree and one microbatch size and count; this "
                          "plan mixes them, so it has no Megatron-LM equivalent (use sailor's runtime)")
    recomputing = {s.recompute for s in plan.stages}
    if len(recomputing) != 1:
        raise SailorError("Megatron-LM recomputes on every stage or none; this plan recomputes on some stages only "
                          "(use sailor's runtime)")
    tp, pp, dp = tps.pop(), plan.pp, plan.dp
    args = [
        f"--tensor-model-parallel-size {tp}", f"--pipeline-model-parallel-size {pp}", *split_args(plan, model),
        f"--num-layers {model.num_blocks}", f"--hidden-size {model.hidden}", f"--num-attention-heads {model.heads}",
        f"--ffn-hidden-size {model.ffn_hidden}", f"--seq-length {model.seq_len}",
        f"--max-position-embeddings {model.context_length}", *megatron_model_args(model),
        f"--micro-batch-size {plan.pipelines[0].microbatch_size}", f"--global-batch-size {plan.global_batch_size}",
    ]
    if recomputing.pop():  # every block, one block per checkpoint: what sailor's runtime does
        args += ["--recompute-granularity full", "--recompute-method uniform", "--recompute-num-layers 1"]
    args += training_args(train_args, plan, model)
    nodes = layout.nodes
    nproc = per_node([n.nproc for n in nodes], "$NODE_RANK")
    return (f"#!/bin/bash\n# {model.name}: TP {tp} x PP {pp} x DP {dp} = {tp * pp * dp} GPUs on {len(nodes)} node(s).\n"
            f"# Run on every node from a Megatron-LM checkout, with NODE_RANK (0..{len(nodes) - 1}) and MASTER_ADDR "
            "(node 0's host) set.\nset -euo pipefail\n"
            "export CUDA_DEVICE_MAX_CONNECTIONS=1  # Megatron requires it with tensor parallelism before Blackwell\n"
            f"torchrun --nnodes={len(nodes)} --node-rank=\"$NODE_RANK\" --nproc-per-node={nproc} "
            f"--master-addr=\"$MASTER_ADDR\" --master-port={port} pretrain_gpt.py \\\n  "
            + " \\\n  ".join(args) + "\n")
