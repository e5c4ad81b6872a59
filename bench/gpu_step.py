"""One GPU: our training step against megatron-core's own GPTModel and training step (prints JSON).

The model is LLaMA-shaped, about 1.1 B parameters (TinyLlama's shape: hidden
2048, 22 blocks, 32 heads in 4 key/value groups, SwiGLU 5632, RMSNorm, rotary,
vocabulary 32000, untied head), bf16 at sequence length 2048. Both sides run
the same global batch (--micro-batch-size x --num-microbatches sequences, one
replica) with AdamW and a gradient-norm clip of 1.0, each in its own process
on the same GPU, one after the other:

  * ours: sailor_ext's Trainer on a one-rank plan (NCCL world of one): bf16
    weights and activations, fp32 main gradients and masters, its 1F1B
    schedule, gradient sync, optimizer (sailor_ext/precision.py);
  * megatron-core: GPTModel with its Transformer Engine layer spec when
    transformer_engine imports, else its local (pure PyTorch) spec, cast by
    its Float16Module and wrapped in its DistributedDataParallel (fp32
    gradient buffers), as Megatron-LM's get_model does, stepped by
    get_megatron_optimizer (bf16 with fp32 masters) after
    get_forward_backward_func's schedule, as Megatron-LM's train_step does.

Reported per side: the median step time after warm-up (each step between two
torch.cuda.synchronize), tokens per second and MFU: model FLOPs per step
(3 x the forward FLOPs of planner.specs.model.ModelSpec.forward_flops: the
backward pass is twice the forward; attention counted over the whole s x s
square, as Megatron-LM counts it; recomputation not counted) over the step
time, against the GPU's dense bf16 peak from planner/specs/hardware.py
(--gpu, or recognised from torch.cuda.get_device_name()).

    python bench/gpu_step.py [--steps 10] [--warmup 3] [--micro-batch-size 1] [--num-microbatches 8]
    python bench/gpu_step.py --layers 2 --steps 3      # a quick look (smaller model)
    python bench/gpu_step.py --sides ours --micro-batch-size 4 --num-microbatches 4 --profile-top 20

--profile-top N profiles one more step of ours with torch.profiler and adds
where its GPU time went: GEMMs, attention, the rest (elementwise, norms,
copies, the optimizer), and the N kernels that took longest, beside the step's
wall time (the difference is time the GPU waited for the host).

Needs one CUDA GPU with about 50 GB free (megatron-core's local spec keeps s x s
attention scores per block; it peaked at 40 GiB on an H100). Results of the
first runs: bench/results/h100-2026-11-25, docs/runtime.md.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# TinyLlama-1.1B's shape (Hugging Face config fields).
LLAMA_1B = {"model_type": "llama", "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 22,
            "num_attention_heads": 32, "num_key_value_heads": 4, "vocab_size": 32000, "max_position_embeddings": 2048,
            "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False,
            "_name_or_path": "bench-llama-1.1b"}
# torch.cuda.get_device_name() -> catalog GPU type (planner/specs/hardware.py); other GPUs need --gpu
# (an H100 PCIe, for one, peaks lower than the catalog's SXM H100-80)
KNOWN_GPUS = {"NVIDIA H100 80GB HBM3": "H100-80", "NVIDIA H200": "H200", "NVIDIA GH200 480GB": "GH200-96",
              "NVIDIA A100-SXM4-80GB": "A100-80", "NVIDIA A100-SXM4-40GB": "A100-40",
              "NVIDIA A100 80GB PCIe": "A100-80", "NVIDIA A100-PCIE-40GB": "A100-40", "NVIDIA L4": "L4",
              "Tesla T4": "T4", "Tesla V100-SXM2-16GB": "V100-16"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _single_rank_env() -> None:
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(_free_port()))


def _timed_steps(step, steps: int, warmup: int) -> list[float]:
    import torch

    times = []
    for i in range(warmup + steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return times


# -- ours ----------------------------------------------------------------------------------------
def run_ours(config: Path, opts, out: Path) -> None:
    import torch

    from sailor_ext.train import parse_args, resolve_plan
    from sailor_ext.trainer import Trainer, init_distributed

    _single_rank_env()
    mbs, n = opts.micro_batch_size, opts.num_microbatches
    args = parse_args(["--model", str(config), "--seq-length", str(opts.seq_length), "--global-batch-size",
                       str(mbs * n), "--micro-batch-size", str(mbs), "--train-iters", str(opts.warmup + opts.steps + 1),
                       "--bf16", "--optimizer", "adam", "--lr", "1e-4", "--clip-grad", "1.0", "--mock-data",
                       *opts.ours_args.split()])
    plan, model, layout = resolve_plan(args, 1)
    device = init_distributed(layout, 0, 0, args.dist_timeout)
    trainer = Trainer(args, plan, model, layout, 0, device)
    times = _timed_steps(trainer.train_step, opts.steps, opts.warmup)
    result = {"times": times, "peak_bytes": torch.cuda.max_memory_allocated(),
              "params": sum(p.numel() for p in trainer.params.values())}
    if opts.profile_top:
        result["profile"] = _kernel_profile(trainer.train_step, opts.profile_top)
    out.write_text(json.dumps(result))
    torch.distributed.destroy_process_group()


KERNEL_KINDS = (("gemm", ("gemm", "nvjet", "cutlass", "xmma", "cublas")), ("attention", ("flash", "fmha", "attention")))


def _kernel_profile(step, top: int) -> dict:
    """One step under torch.profiler: GPU time by kind of kernel and the `top` longest kernels, in ms."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
               and not getattr(e, "is_user_annotation", False)]  # record_function ranges span kernels
    by_name: dict[str, float] = {}
    for e in kernels:
        by_name[e.name] = by_name.get(e.name, 0.0) + e.time_range.elapsed_us() / 1e3
    kinds = {kind: 0.0 for kind, _ in KERNEL_KINDS} | {"other": 0.0}
    for name, ms in by_name.items():
        kind = next((k for k, marks in KERNEL_KINDS if any(m in name.lower() for m in marks)), "other")
        kinds[kind] += ms
    busy = sum(by_name.values())
    # the profiler slows the host: wall_ms_profiled is above the step's usual time, the kernels' times are not
    return {"wall_ms_profiled": round(wall * 1e3, 1), "gpu_busy_ms": round(busy, 1),
            "by_kind_ms": {k: round(v, 1) for k, v in kinds.items()},
            "top_kernels_ms": [[name[:120], round(ms, 2)] for name, ms in
                               sorted(by_name.items(), key=lambda kv: -kv[1])[:top]]}


# -- megatron-core ---------------------------------------------------------------------------------
def run_megatron(config: Path, opts, out: Path) -> None:
    import torch
    import torch.nn.functional as F

    from sailor_ext import compat  # noqa: F401  (the warning filters for megatron's optional extensions)
    from megatron.core import parallel_state, tensor_parallel
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.transformer.module import Float16Module
    from megatron.core.transformer.transformer_config import TransformerConfig

    hf = json.loads(config.read_text())
    _single_rank_env()
    torch.cuda.set_device(0)
    torch.distributed.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
    parallel_state.initialize_model_parallel(1, 1)
    tensor_parallel.model_parallel_cuda_manual_seed(1234)
    try:
        import transformer_engine  # noqa: F401
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_with_transformer_engine_spec

        spec, spec_name = get_gpt_layer_with_transformer_engine_spec(), "transformer_engine"
    except ImportError:
        spec, spec_name = get_gpt_layer_local_spec(normalization="RMSNorm"), "local (no transformer_engine)"
    cfg = TransformerConfig(
        num_layers=hf["num_hidden_layers"], hidden_size=hf["hidden_size"],
        num_attention_heads=hf["num_attention_heads"], num_query_groups=hf["num_key_value_heads"],
        ffn_hidden_size=hf["intermediate_size"], kv_channels=hf["hidden_size"] // hf["num_attention_heads"],
        normalization="RMSNorm", layernorm_epsilon=hf["rms_norm_eps"], gated_linear_unit=True,
        activation_func=F.silu, add_bias_linear=False, hidden_dropout=0.0, attention_dropout=0.0, bf16=True,
        params_dtype=torch.bfloat16,
        # the fused kernels below need Apex or megatron's compiled extensions; ours runs without them too
        masked_softmax_fusion=False, bias_activation_fusion=False, bias_dropout_fusion=False,
        gradient_accumulation_fusion=False, apply_rope_fusion=False, persist_layer_norm=False)
    model = GPTModel(cfg, spec, vocab_size=hf["vocab_size"], max_sequence_length=opts.seq_length,
                     position_embedding_type="rope", rotary_base=int(hf["rope_theta"]),
                     share_embeddings_and_output_weights=False).cuda()
    # Megatron-LM's get_model: the whole model in bf16 (norm weights included), then DDP with fp32 grad buffers
    wrapped = Float16Module(cfg, model)
    ddp = DistributedDataParallel(cfg, DistributedDataParallelConfig(grad_reduce_in_fp32=True), module=wrapped)
    optimizer = get_megatron_optimizer(OptimizerConfig(
        optimizer="adam", lr=1e-4, weight_decay=0.01, adam_beta1=0.9, adam_beta2=0.95, adam_eps=1e-8, clip_grad=1.0,
        bf16=True, params_dtype=torch.bfloat16), [ddp])
    cfg.no_sync_func = ddp.no_sync
    cfg.finalize_model_grads_func = finalize_model_grads
    cfg.grad_scale_func = optimizer.scale_loss
    forward_backward = get_forward_backward_func()
    mbs, n, s = opts.micro_batch_size, opts.num_microbatches, opts.seq_length
    positions = torch.arange(s, device="cuda").unsqueeze(0).expand(mbs, s)

    def batches():
        generator = torch.Generator(device="cuda").manual_seed(0)
        while True:
            tokens = torch.randint(0, hf["vocab_size"], (mbs, s + 1), device="cuda", generator=generator)
            yield tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

    data = batches()

    def forward_step(data_iterator, module):
        tokens, labels = next(data_iterator)
        token_losses = module(tokens, positions, None, labels=labels)  # [b, s], fp32

        def loss_func(losses):
            total = losses.float().sum()
            return total, torch.tensor(losses.numel(), device=losses.device, dtype=torch.int), {"lm loss": total}

        return token_losses, loss_func

    def step():
        ddp.zero_grad_buffer()
        optimizer.zero_grad()
        forward_backward(forward_step_func=forward_step, data_iterator=data, model=[ddp], num_microbatches=n,
                         seq_length=s, micro_batch_size=mbs, forward_only=False)
        optimizer.step()

    times = _timed_steps(step, opts.steps, opts.warmup)
    out.write_text(json.dumps({"times": times, "peak_bytes": torch.cuda.max_memory_allocated(),
                               "params": sum(p.numel() for p in model.parameters()), "layer_spec": spec_name}))
    torch.distributed.destroy_process_group()


# -- orchestration -----------------------------------------------------------------------------------
def gpu_type(requested: str | None) -> str:
    import torch

    from planner.errors import SailorError
    from planner.specs.hardware import CATALOG

    if requested:
        if requested not in CATALOG:
            raise SailorError(f"unknown --gpu {requested}; known: {', '.join(sorted(CATALOG))}")
        return requested
    name = torch.cuda.get_device_name(0)
    if name in KNOWN_GPUS:
        return KNOWN_GPUS[name]
    raise SailorError(f"cannot tell the bf16 peak of {name!r}; give --gpu TYPE (planner/specs/hardware.py)")


def summary(side: dict, flops_per_step: float, tokens: int, peak: float) -> dict:
    t = statistics.median(side["times"])
    return {"median_step_s": round(t, 4), "min_step_s": round(min(side["times"]), 4), "tokens_per_s": round(tokens / t),
            "mfu": round(flops_per_step / t / peak, 4), "peak_memory_gib": round(side["peak_bytes"] / 2**30, 2),
            "params": side["params"], **{k: side[k] for k in ("layer_spec", "profile") if k in side}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10, help="timed steps per side (after --warmup)")
    ap.add_argument("--warmup", type=int, default=3)
    # 8 sequences of 2048 tokens; microbatches of 1 keep megatron's local spec (s x s attention scores,
    # softmax in fp32) within an 80 GB GPU
    ap.add_argument("--micro-batch-size", type=int, default=1)
    ap.add_argument("--num-microbatches", type=int, default=8)
    ap.add_argument("--seq-length", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=LLAMA_1B["num_hidden_layers"], help="transformer blocks")
    ap.add_argument("--gpu", help="GPU type for the bf16 peak (default: recognised from the device name)")
    ap.add_argument("--sides", default="ours,megatron", help="which to run, comma-separated: ours, megatron")
    ap.add_argument("--ours-args", default="", metavar="ARGS",
                    help="more sailor_ext.train arguments for ours, e.g. '--no-rope-fusion --no-bias-swiglu-fusion'")
    ap.add_argument("--profile-top", type=int, default=0, metavar="N",
                    help="profile one more step of ours: GPU time by kind of kernel and the N longest kernels")
    ap.add_argument("--side", choices=("ours", "megatron"), help=argparse.SUPPRESS)
    ap.add_argument("--config", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    opts = ap.parse_args()
    if opts.side:
        (run_ours if opts.side == "ours" else run_megatron)(Path(opts.config), opts, Path(opts.out))
        return 0

    import torch

    from planner.errors import SailorError
    from planner.specs.hardware import CATALOG
    from planner.specs.model import get_model

    sides = [s for s in opts.sides.split(",") if s]
    if not sides or set(sides) - {"ours", "megatron"}:
        print(f"bench/gpu_step.py: --sides takes ours, megatron or both, got {opts.sides!r}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("bench/gpu_step.py needs a CUDA GPU; none is visible", file=sys.stderr)
        return 2
    try:
        gpu = gpu_type(opts.gpu)
    except SailorError as e:
        print(f"sailor: error: {e}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        config = work / "config.json"
        config.write_text(json.dumps({**LLAMA_1B, "num_hidden_layers": opts.layers}))
        model = get_model(str(config), seq_len=opts.seq_length)
        tokens = opts.micro_batch_size * opts.num_microbatches * opts.seq_length
        flops = 3.0 * sum(model.forward_flops(layer) for layer in range(model.num_layers)) * tokens
        peak = CATALOG[gpu].peak_flops("bf16")
        result = {"gpu": gpu, "device_name": torch.cuda.get_device_name(0), "bf16_peak_tflops": peak / 1e12,
                  "model": {"shape": "LLaMA (TinyLlama-1.1B)", "blocks": opts.layers, "seq_length": opts.seq_length,
                            "params": model.total_params(padded=True)},
                  "global_batch": {"micro_batch_size": opts.micro_batch_size,
                                   "num_microbatches": opts.num_microbatches, "tokens": tokens},
                  "model_tflops_per_step": round(flops / 1e12, 2),
                  **({"ours_args": opts.ours_args} if opts.ours_args else {})}
        for side in sides:
            out = work / f"{side}.json"
            argv = [sys.executable, __file__, "--side", side, "--config", str(config), "--out", str(out),
                    "--steps", str(opts.steps), "--warmup", str(opts.warmup), "--micro-batch-size",
                    str(opts.micro_batch_size), "--num-microbatches", str(opts.num_microbatches), "--seq-length",
                    str(opts.seq_length), "--profile-top", str(opts.profile_top), f"--ours-args={opts.ours_args}"]
            done = subprocess.run(argv, cwd=work, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
                                  text=True)
            if done.returncode != 0:
                result[side] = {"error": (done.stderr.strip() or done.stdout.strip())[-3000:]}
                continue
            result[side] = summary(json.loads(out.read_text()), flops, tokens, peak)
        if all("median_step_s" in result.get(s, {}) for s in ("ours", "megatron")):
            result["ours_over_megatron_step_time"] = round(result["ours"]["median_step_s"] /
                                                          result["megatron"]["median_step_s"], 3)
    print(json.dumps(result, indent=1))
    return 0 if all("error" not in result[s] for s in sides) else 1


if __name__ == "__main__":
    sys.exit(main())
