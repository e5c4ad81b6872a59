"""Closing the loop on one GPU: profile, plan, simulate, run, and compare (prints JSON).

1. Profile the model on this GPU with `sailor profile model --device cuda` (TP 1,
   the microbatch sizes below, the runtime's precision: bf16 on GPUs).
2. Plan with `sailor plan --gpus TYPE@local=1` on that profile; add hand-written
   one-GPU plans beside the pick: every microbatch size, with and without
   activation recomputation (one GPU runs one rank: TP, PP and DP need more GPUs).
3. Predict each plan with `sailor simulate --profiles` (iteration time, peak memory).
4. Run each plan with the training runtime (`sailor launch --local`, NCCL world of
   one) for --warmup + --steps steps; the measured step time is the median after
   warm-up, the measured peak memory torch's peak allocated bytes (the metrics'
   peak_memory_bytes). torch does not count the CUDA context and the libraries'
   own buffers, which the simulator budgets as the GPU's runtime overhead
   (planner/specs/hardware.py, 1.5 GiB by default): the prediction compared is
   the simulator's peak without that term (`predicted_peak_gib`; with it:
   `predicted_peak_with_overhead_gib`, against the most the device had in use at
   a log point, `measured_device_used_gib`: context, libraries and torch's cache).

Nothing is fitted to the runs: the predictions use only the profile. The model is
bench/gpu_step.py's LLaMA shape (TinyLlama-1.1B) unless --model names another.

    python bench/sim_vs_real_gpu.py [--layers 22] [--global-batch 16] [--steps 8] [--warmup 3] [--keep DIR]
    python bench/sim_vs_real_gpu.py --gpu H100-80 --profiles bench/results/h100-2026-11-25/profiles --predict-only
                                     # predictions only, from a profile measured before (no GPU needed)
    python bench/sim_vs_real_gpu.py --device cpu --layers 2 --hidden 256 --seq-length 256   # a dry run on CPU
                                                       (tests/profiler/test_sim_vs_real_gpu.py runs one)
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT.parent))

from gpu_step import LLAMA_1B, gpu_type  # noqa: E402
from sim_vs_real_cpu import describe, sailor, train  # noqa: E402


def run(plan_path: Path, work: Path, steps: int, warmup: int) -> dict:
    """Median step time after warm-up and the largest memory figures of the metrics (None on CPU)."""
    lines = train(plan_path, work, warmup + steps)
    if isinstance(lines, str):
        return {"error": lines}
    return {"step_s": statistics.median(m["step_time_s"] for m in lines[warmup:]),
            **{key: max((m.get(key, 0) for m in lines), default=0) or None
               for key in ("peak_memory_bytes", "device_used_bytes")}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="model preset or config.json (default: the LLaMA 1.1B shape of gpu_step.py)")
    ap.add_argument("--layers", type=int, default=LLAMA_1B["num_hidden_layers"], help="blocks of the default model")
    ap.add_argument("--hidden", type=int, help="hidden size of the default model (a smaller model for a dry run)")
    ap.add_argument("--seq-length", type=int, default=2048)
    ap.add_argument("--global-batch", type=int, default=16)
    ap.add_argument("--micro-batch-sizes", default="1,2,4")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=20, help="timed repetitions of the profile (default 20)")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--gpu", help="GPU type (default: recognised from the device name; CPU with --device cpu)")
    ap.add_argument("--keep", metavar="DIR", help="keep the profile, plans and metrics here")
    ap.add_argument("--profiles", metavar="DIR", help="use this profiles directory instead of profiling")
    ap.add_argument("--predict-only", action="store_true", help="plan and simulate; run nothing (no GPU needed)")
    args = ap.parse_args()

    import torch

    from planner.errors import SailorError

    if args.device == "cuda" and not torch.cuda.is_available() and not args.predict_only:
        print("bench/sim_vs_real_gpu.py needs a CUDA GPU (or --device cpu for a dry run)", file=sys.stderr)
        return 2
    if args.device == "cuda" and not args.gpu and not torch.cuda.is_available():
        print("sailor: error: --predict-only without a visible GPU needs --gpu TYPE (see `sailor list gpus`)",
              file=sys.stderr)
        return 2
    try:
        gpu = "CPU" if args.device == "cpu" else gpu_type(args.gpu)
    except SailorError as e:
        print(f"sailor: error: {e}", file=sys.stderr)
        return 2
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="sailor-simreal-gpu-"))
    work.mkdir(parents=True, exist_ok=True)
    model = args.model
    if model is None:
        config = {**LLAMA_1B, "num_hidden_layers": args.layers, "max_position_embeddings": args.seq_length}
        if args.hidden:
            config.update(hidden_size=args.hidden, intermediate_size=args.hidden * 11 // 4,
                          num_attention_heads=max(1, args.hidden // 64), num_key_value_heads=max(1, args.hidden // 512))
        model = str(work / "config.json")
        Path(model).write_text(json.dumps(config))

    t0 = time.time()
    profiles = Path(args.profiles) if args.profiles else work / "profiles"
    if not args.profiles:
        sailor("profile", "model", "--model", model, "--device", args.device, "--micro-batch-sizes",
               args.micro_batch_sizes, "--tp", "1", "--repeats", str(args.repeats), "-o", str(profiles), "--quiet",
               *([] if args.device == "cpu" else ["--gpu", gpu]))
    profiled_s = time.time() - t0
    picked = work / "plan-pick.json"
    sailor("plan", "--model", model, "--seq-length", str(args.seq_length), "--gpus", f"{gpu}@local=1",
           "--global-batch", str(args.global_batch), "--profiles", str(profiles), "--microbatch-sizes",
           args.micro_batch_sizes, "-o", str(picked), "--json")
    pick = json.loads(picked.read_text())
    plans = {"planner's pick": pick}
    for mbs in map(int, args.micro_batch_sizes.split(",")):
        for recompute in (False, True):
            plan = {**pick, "pipelines": [{"microbatch_size": mbs, "num_microbatches": args.global_batch // mbs}],
                    "stages": [{**s, "recompute": recompute} for s in pick["stages"]]}
            if args.global_batch % mbs == 0 and describe(plan) != describe(pick):
                plans[f"microbatch {mbs}{', recompute' if recompute else ''}"] = plan

    rows = []
    for i, (name, plan) in enumerate(plans.items()):
        path = work / f"plan{i}.json"
        path.write_text(json.dumps(plan, indent=1))
        sim = json.loads(sailor("simulate", str(path), "--profiles", str(profiles), "--json").stdout)
        allocated = sim["peak_memory_bytes"] - sim["stages"][0]["memory_parts"]["runtime"]  # one stage: one GPU
        row = {"plan": name, "layout": describe(plan), "fits_predicted": sim["fits_in_memory"],
               "predicted_step_s": round(sim["iteration_time_s"], 4), "predicted_peak_gib": round(allocated / 2**30, 3),
               "predicted_peak_with_overhead_gib": round(sim["peak_memory_bytes"] / 2**30, 3)}
        rows.append(row)
        if args.predict_only:
            continue
        real = run(path, work, args.steps, args.warmup)
        if "error" in real:
            row["run_error"] = real["error"]
        else:
            row.update(measured_step_s=round(real["step_s"], 4),
                       step_error_pct=round(100 * (sim["iteration_time_s"] - real["step_s"]) / real["step_s"], 1))
            if real["peak_memory_bytes"]:
                row.update(measured_peak_gib=round(real["peak_memory_bytes"] / 2**30, 3),
                           memory_error_pct=round(100 * (allocated - real["peak_memory_bytes"])
                                                  / real["peak_memory_bytes"], 1))
            if real["device_used_bytes"]:  # the whole GPU: the prediction with its runtime-overhead term
                used = real["device_used_bytes"]
                row.update(measured_device_used_gib=round(used / 2**30, 3),
                           device_memory_error_pct=round(100 * (sim["peak_memory_bytes"] - used) / used, 1))
        print(f"{name}: {json.dumps(row)}", file=sys.stderr, flush=True)
    ok = [r for r in rows if "step_error_pct" in r]
    result = {"device": args.device, "gpu": gpu,
              "device_name": torch.cuda.get_device_name(0) if args.device == "cuda" and not args.predict_only else None,
              "torch": torch.__version__, "model": Path(model).stem if args.model else "LLaMA (TinyLlama-1.1B shape)",
              "layers": args.layers, "seq_length": args.seq_length, "global_batch": args.global_batch,
              "steps": args.steps, "warmup": args.warmup, "profile_s": round(profiled_s, 1),
              "mean_abs_step_error_pct": round(statistics.fmean(abs(r["step_error_pct"]) for r in ok), 1) if ok else None,
              "max_abs_step_error_pct": max((abs(r["step_error_pct"]) for r in ok), default=None),
              "max_abs_memory_error_pct": max((abs(r["memory_error_pct"]) for r in ok if "memory_error_pct" in r),
                                              default=None),
              "plans": rows}
    print(json.dumps(result, indent=1))
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if args.predict_only or len(ok) == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
