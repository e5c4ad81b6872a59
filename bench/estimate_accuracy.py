"""How far the analytical estimate is from every measured profile in Sailor's data (JSON out).

Leave one GPU type out: for each GPU type G in sailor-data/profiles, the
estimator's efficiencies are fitted to the profiles of every other GPU type
(all models), pulled towards the physical prior only (never towards the
defaults, which saw G), and the estimate of each model on G is compared
with G's measured profile, point by point (every measured microbatch size
and TP degree) and layer by layer (forward + backward seconds; forward only
where Sailor's profile has no backward, as for every embedding). Per-layer
errors count every layer of the model, so the transformer blocks (profiled
once, copied to every block) weigh as much as they do in a pipeline.

Also: the whole model's time per point (the sum over layers), the optimizer
seconds per parameter, and the analytical memory facts (parameters,
activation bytes kept for backward, output bytes per layer) against
llm_info.json at every TP degree it has.

Sailor's LLAMA-3-8 is not LLaMA-3-8B: llm_info's parameter counts are those
of a 4096-wide model with full multi-head attention, an FFN of 16384 with
biases and a tied 50257-token vocabulary; the estimate is for that model
(`AS_PROFILED`; `model_check` reports how its parameters match llm_info).

Then (`our_runtime`) the estimate of our own runtime against profiles measured with it on a GPU
type Sailor's data lacks (--ours; default the H100 profiles in bench/results/h100-2026-11-28),
counted as our runtime runs it and, for comparison, as Megatron would.

    python bench/estimate_accuracy.py [--data ../shared/sailor-data] [--by chip] [--same-model] [--fit] [--points]
                                      [--ours DIR]

--by chip leaves out A100-40 and A100-80 together (one chip, two memory sizes).
--same-model calibrates on the estimated model's own profiles only, as `sailor plan --model M`
does (it loads no other model's).
--fit prints the efficiencies fitted to every profile (estimate.DEFAULT_EFFICIENCY).
--points adds every (model, GPU, microbatch, TP) point's whole-model error.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planner.profiles.calibrate import MIN_MEASURED_S, PHYSICAL_PRIOR, comparable_layers, fit_efficiency  # noqa: E402
from planner.profiles.estimate import (ADAM_BYTES_PER_PARAM, DTYPE_BYTES, analytic_memory,  # noqa: E402
                                       estimate_profile, layer_seconds, optimizer_s_per_param)
from planner.profiles.profile import load_profile_file, smooth_over_microbatches  # noqa: E402
from planner.profiles.sailor_data import load_sailor_dir  # noqa: E402
from planner.profiles.store import load_profiles  # noqa: E402
from planner.specs.hardware import CATALOG  # noqa: E402
from planner.specs.model import BLOCK, HEAD, ModelSpec, get_model  # noqa: E402

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "sailor-data"
OURS = Path(__file__).resolve().parent / "results" / "h100-2026-11-28" / "profiles"  # sailor profile, one H100
# The models as Sailor profiled them, where llm_info's parameter counts say they differ from the preset.
AS_PROFILED = {"llama-3-8b": dict(kv_heads=0, ffn_hidden=16384, qkv_bias=True, out_bias=True, mlp_bias=True,
                                  vocab=50257, tied_embeddings=True)}
CHIPS = {"A100-40": "A100", "A100-80": "A100"}


def profiled_model(name: str) -> ModelSpec:
    return replace(get_model(name), **AS_PROFILED.get(name, {}))


def pct(x: float) -> float:
    return round(100 * x, 1)


def median(xs) -> float:
    return statistics.median(xs) if xs else float("nan")


def smoothed(p):
    return replace(p, times=smooth_over_microbatches(p.times))


def pair_errors(model: ModelSpec, measured, eff) -> dict:
    """Per-layer and whole-model relative errors of the estimate against one measured profile."""
    gpu = CATALOG[measured.gpu]
    layers, whole, kinds, worst = [], [], {}, (0.0, None)
    for (mbs, tp), lt in sorted(measured.times.items()):
        comparable = set(comparable_layers(model, measured.memory.get(tp), tp, DTYPE_BYTES[measured.precision]))
        est = {}
        total_est = total_real = 0.0
        for layer in range(model.num_layers):
            kind = model.kind(layer)
            if kind not in est:
                rep = next(i for i in range(model.num_layers) if model.kind(i) == kind)
                est[kind] = (rep in comparable, layer_seconds(model, rep, mbs, tp, gpu, measured.precision, eff))
            ok, (f, b) = est[kind]
            if not ok:
                continue
            timed_bwd = lt.bwd[layer] >= MIN_MEASURED_S
            real = lt.fwd[layer] + (lt.bwd[layer] if timed_bwd else 0.0)
            guess = f + (b if timed_bwd else 0.0)
            err = (guess - real) / real
            layers.append(abs(err))
            kinds.setdefault(kind, []).append(abs(err))
            total_est, total_real = total_est + guess, total_real + real
            if abs(err) > worst[0]:
                worst = (abs(err), {"mbs": mbs, "tp": tp, "layer": layer, "kind": kind, "error_pct": pct(err)})
        whole.append({"mbs": mbs, "tp": tp, "error_pct": pct((total_est - total_real) / total_real)})
    return {"layers": layers, "whole": whole, "kinds": kinds, "worst": worst}


def memory_errors(data: Path) -> dict:
    """Per model, TP degree, fact and layer kind: the analytical memory's worst signed error (%)
    against llm_info (the head's output is the pipeline's end, sent nowhere: not compared; nor are
    the activations of heads that kept no logits)."""
    info = json.loads((data / "llm_info.json").read_text())
    out = {}
    for sailor_name, by_tp in sorted(info.items()):
        model = profiled_model(get_model(sailor_name).name)
        rows = {}
        for tp, layers in sorted(by_tp.items(), key=lambda kv: int(kv[0])):
            t = int(tp)
            mem = analytic_memory(model, t, "fp32")
            worst: dict[str, dict[str, float]] = {"params": {}, "activation_bytes": {}, "output_bytes": {}}
            for i in range(model.num_layers):
                real, kind = layers[str(i)], model.kind(i)
                logits = real["act_mem_bytes"] / model.seq_len >= 4 * model.padded_vocab(t) / t
                for key, est, meas, compared in (
                        ("params", mem.params[i], real["params_floats"], True),
                        ("activation_bytes", mem.activation_bytes[i], real["act_mem_bytes"], kind != HEAD or logits),
                        ("output_bytes", mem.output_bytes[i], real["act_output_bytes"], kind != HEAD)):
                    if compared and meas > 0:
                        e = pct((est - meas) / meas)
                        if abs(e) >= abs(worst[key].get(kind, 0.0)):
                            worst[key][kind] = e
            rows[tp] = worst
        out[model.name] = rows
    return out


def model_check(data: Path) -> dict:
    """Largest parameter mismatch per layer kind between the profiled model and llm_info."""
    info = json.loads((data / "llm_info.json").read_text())
    out = {}
    for sailor_name, by_tp in info.items():
        model = profiled_model(get_model(sailor_name).name)
        worst: dict[str, float] = {}
        for tp, layers in by_tp.items():
            for i in range(model.num_layers):
                real = layers[str(i)]["params_floats"]
                est = model.params(i, int(tp))
                rel = abs(est - real) / max(real, 1)
                worst[model.kind(i)] = max(worst.get(model.kind(i), 0.0), rel)
        out[model.name] = {k: pct(v) for k, v in worst.items()}
    return out


def run(data: Path, by: str, points: bool, same_model: bool = False) -> dict:
    raw, _ = load_sailor_dir(data)
    models = {name: profiled_model(name) for name, _ in raw}
    group = (lambda g: CHIPS.get(g, g)) if by == "chip" else (lambda g: g)
    pairs, by_gpu, by_kind, all_layers, calibrations = [], {}, {}, [], {}
    for held in sorted({group(g) for _, g in raw}):
        for (name, gpu), measured in sorted(raw.items()):
            if group(gpu) != held:
                continue
            key = f"{held}, {name}" if same_model else held
            if key not in calibrations:
                training = [smoothed(p) for (m, g), p in raw.items()
                            if group(g) != held and (m == name or not same_model)]
                calibrations[key] = fit_efficiency(training, models, CATALOG, prior=PHYSICAL_PRIOR)
            eff = calibrations[key]
            model = models[name]
            e = pair_errors(model, measured, eff)
            opt_est = optimizer_s_per_param(CATALOG[gpu], eff)
            row = {
                "model": name, "gpu": gpu, "points": len(measured.times),
                "median_pct": pct(median(e["layers"])),
                "worst_pct": e["worst"][1]["error_pct"] if e["worst"][1] else None, "worst_at": e["worst"][1],
                "by_kind_median_pct": {k: pct(median(v)) for k, v in e["kinds"].items()},
                "whole_model_median_pct": pct(median([w["error_pct"] / 100 for w in e["whole"]])),
                "optimizer_error_pct": pct((opt_est - measured.optimizer_s_per_param) / measured.optimizer_s_per_param)
                if measured.optimizer_s_per_param > 0 else None,
            }
            if points:
                row["whole_model_points"] = e["whole"]
            pairs.append(row)
            by_gpu.setdefault(gpu, []).extend(e["layers"])
            for k, v in e["kinds"].items():
                by_kind.setdefault(k, []).extend(v)
            all_layers.extend(e["layers"])
    per_gpu = {g: pct(median(v)) for g, v in sorted(by_gpu.items())}
    worst_gpu = max(per_gpu, key=per_gpu.get)
    return {
        "method": f"leave one {'chip' if by == 'chip' else 'GPU type'} out"
                  f"{', calibrating on the same model only' if same_model else ''}; per-layer |relative error| "
                  "of forward + backward seconds",
        "overall_median_pct": pct(median(all_layers)),
        "median_of_pair_medians_pct": round(median([p["median_pct"] for p in pairs]), 1),
        "by_gpu_median_pct": per_gpu,
        "worst_gpu": {"gpu": worst_gpu, "median_pct": per_gpu[worst_gpu]},
        "by_kind_median_pct": {k: pct(median(v)) for k, v in by_kind.items()},
        "pairs": pairs,
        "efficiencies_fitted_without": {k: {f: round(v, 7) for f, v in e.to_dict().items()}
                                        for k, e in calibrations.items()},
        "memory": memory_errors(data),
        "model_check_params_worst_pct": model_check(data),
        "not_compared": [f"passes measured under {MIN_MEASURED_S * 1e6:.0f} us (every embedding backward: 0-3 us)",
                         "heads that kept no logits (GPT-Neo-2.7: its profiled head is the final norm only)"],
        "optimizer_model": f"{ADAM_BYTES_PER_PARAM} B/param at the HBM bandwidth times e_mem",
    }


def our_runtime(data: Path, ours: Path) -> dict:
    """The estimate of our runtime against profiles measured with it (`sailor profile`) on GPU types
    Sailor's data does not have: calibrated as `sailor plan --profiles DATA --model M` calibrates
    (Sailor's profiles of the model), then estimated as our runtime runs it (fused attention, our
    optimizer step and saved tensors) and, for comparison, as Megatron-DeepSpeed would (the count
    every estimate used before). Per microbatch size: the block's forward + backward and the whole
    model's error (%); per profile: the optimizer step's and a block's activation bytes."""
    rows = []
    for f in sorted(ours.glob("*/*/profile.json")):
        measured = load_profile_file(f)
        model, gpu = measured.model_spec or get_model(measured.model), CATALOG[measured.gpu]
        eff = load_profiles([str(data)], model=model).efficiency()
        block = next(i for i in range(model.num_layers) if model.kind(i) == BLOCK)
        row = {"model": model.name, "gpu": gpu.name, "precision": measured.precision, "runtimes": {}}
        for runtime in ("sailor", "megatron-deepspeed"):
            est = estimate_profile(model, gpu, measured.precision, eff, None, runtime)
            points = {}
            for (mbs, tp), lt in sorted(measured.times.items()):
                e = est.times[(mbs, tp)]
                points[f"{mbs}/{tp}"] = {
                    "block_pct": pct((e.fwd[block] + e.bwd[block]) / (lt.fwd[block] + lt.bwd[block]) - 1),
                    "model_pct": pct((sum(e.fwd) + sum(e.bwd)) / (sum(lt.fwd) + sum(lt.bwd)) - 1)}
            row["runtimes"][runtime] = {
                "points (mbs/tp)": points,
                "optimizer_pct": pct(est.optimizer_s_per_param / measured.optimizer_s_per_param - 1),
                "block_activation_bytes_pct": pct(est.memory[1].activation_bytes[block]
                                                  / measured.memory[1].activation_bytes[block] - 1)}
        rows.append(row)

    def summary(runtime: str) -> dict:
        blocks = [abs(p["block_pct"]) for r in rows for p in r["runtimes"][runtime]["points (mbs/tp)"].values()]
        return {"block_median_abs_pct": round(median(blocks), 1), "block_worst_abs_pct": max(blocks, default=None),
                "optimizer_pct": {r["model"]: r["runtimes"][runtime]["optimizer_pct"] for r in rows},
                "block_activation_bytes_pct": {r["model"]: r["runtimes"][runtime]["block_activation_bytes_pct"]
                                               for r in rows}}

    return {"profiles": str(ours), "method": our_runtime.__doc__.split("\n\n")[0].replace("\n    ", " "),
            "summary": {rt: summary(rt) for rt in ("sailor", "megatron-deepspeed")} if rows else {},
            "pairs": rows}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(DEFAULT_DATA))
    ap.add_argument("--by", choices=["type", "chip"], default="type",
                    help="leave out one GPU type (default) or one chip (A100-40 and A100-80 together)")
    ap.add_argument("--same-model", action="store_true",
                    help="calibrate on the estimated model's own profiles only (what `sailor plan --model M` loads)")
    ap.add_argument("--fit", action="store_true", help="print the efficiencies fitted to every profile")
    ap.add_argument("--points", action="store_true", help="add every point's whole-model error")
    ap.add_argument("--ours", default=str(OURS), metavar="DIR",
                    help="profiles measured with our runtime on GPUs Sailor's data lacks, to check the estimate "
                         "of our runtime against (default: the H100 profiles of bench/results; '' for none)")
    args = ap.parse_args()
    data = Path(args.data)
    if not (data / "profiles").is_dir():
        print(json.dumps({"skipped": f"no sailor-data at {data}"}))
        return 0
    if args.fit:
        raw, _ = load_sailor_dir(data)
        models = {name: profiled_model(name) for name, _ in raw}
        eff = fit_efficiency([smoothed(p) for p in raw.values()], models, CATALOG, prior=PHYSICAL_PRIOR)
        print(json.dumps({"efficiency": eff.to_dict()}, indent=1))
        return 0
    out = run(data, args.by, args.points, args.same_model)
    if args.ours:
        if not Path(args.ours).is_dir():
            print(f"bench/estimate_accuracy.py: --ours {args.ours} is not a directory; give one written by "
                  "`sailor profile model`, or '' for none", file=sys.stderr)
            return 2
        out["our_runtime"] = our_runtime(data, Path(args.ours))
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
