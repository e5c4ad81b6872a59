"""`sailor list gpus|zones|models`: what sailor knows before you give it anything.

GPU types with their memory, speed, node size and prices; zones with their
region and what sending a GB to another zone costs; model presets with their
size. With --cluster, a cluster file's own GPU types, zones and prices are
included, as `sailor plan` would see them.
"""
from __future__ import annotations

import argparse
import json

GIB = 2**30


def gpu_rows(cluster) -> list[dict]:
    prices = {gpu: [] for gpu in cluster.gpus}
    for (gpu, zone), price in cluster.prices.items():
        prices[gpu].append(f"{zone} {price:g}")
    return [{"gpu": g.name, "memory_gib": round(g.memory_bytes / GIB, 2), "bf16_tflops": g.bf16_tflops,
             "fp32_tflops": g.fp32_tflops, "gpus_per_node": g.gpus_per_node, "usd_per_hour": g.price_per_hour,
             "spot_usd_per_hour": g.spot_price_per_hour, "zone_prices": prices[g.name]} for g in cluster.gpus.values()]


def zone_rows(cluster) -> list[dict]:
    return [{"zone": z.name, "region": z.region} for z in cluster.zones.values()]


def model_rows() -> list[dict]:
    from planner.specs.model import ALIASES, get_model, preset_names

    aliases: dict[str, list[str]] = {}
    for alias, name in ALIASES.items():
        if alias[0].isupper():
            aliases.setdefault(name, []).append(alias)
    rows = []
    for name in preset_names():
        m = get_model(name)
        rows.append({"model": name, "family": m.family, "params": m.total_params(padded=False), "layers": m.num_blocks,
                     "hidden": m.hidden, "heads": m.heads, "seq_length": m.seq_len,
                     "sailor_names": aliases.get(name, [])})
    return rows


def cmd_list(args) -> int:
    from planner.specs.hardware import load_cluster

    cluster = load_cluster(args.cluster)
    rows = {"gpus": lambda: gpu_rows(cluster), "zones": lambda: zone_rows(cluster), "models": model_rows}[args.what]()
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    from rich.table import Table

    from planner.report import console

    t = Table(title=TITLES[args.what], title_justify="left")
    if args.what == "gpus":
        zoned = any(r["zone_prices"] for r in rows)  # a cluster file's prices per zone
        for col in ("GPU", "memory", "bf16 TFLOP/s", "fp32 TFLOP/s", "per node", "$/GPU-hour", "spot $/h") + \
                (("$/h in zones",) if zoned else ()):
            t.add_column(col, justify="left" if col in ("GPU", "$/h in zones") else "right")
        for r in rows:
            t.add_row(r["gpu"], f"{r['memory_gib']:g} GiB", f"{r['bf16_tflops']:g}", f"{r['fp32_tflops']:g}",
                      str(r["gpus_per_node"]), f"{r['usd_per_hour']:.2f}", f"{r['spot_usd_per_hour']:.2f}",
                      *((", ".join(r["zone_prices"]),) if zoned else ()))
    elif args.what == "zones":
        t.add_column("zone")
        t.add_column("region")
        for r in rows:
            t.add_row(r["zone"], r["region"])
    else:
        for col in ("model", "family", "parameters", "blocks", "hidden", "heads", "seq length", "Sailor's name"):
            t.add_column(col, justify="left" if col in ("model", "family", "Sailor's name") else "right")
        for r in rows:
            t.add_row(r["model"], r["family"], _count(r["params"]), str(r["layers"]), str(r["hidden"]),
                      str(r["heads"]), str(r["seq_length"]), ", ".join(r["sailor_names"]))
    out = console()
    out.print(t)
    out.print(FOOTNOTES[args.what])
    if args.what == "models":
        from planner.specs.families import hf_types

        out.print(f"A config.json's model_type may be: {', '.join(hf_types())}.")
    return 0


def _count(n: int) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.0f} M" if n >= 1e6 else f"{n:,}"


TITLES = {"gpus": "GPU types (on-demand and spot list prices, USD per GPU-hour)", "zones": "zones",
          "models": "model presets (and Hugging Face config.json files of the model types below)"}
FOOTNOTES = {
    "gpus": "Use them as --gpus TYPE@ZONE=N; a cluster file (--cluster) adds types and overrides fields and prices.",
    "zones": "Egress per GB between zones: free inside a zone, same region $0.01, same continent $0.02, other "
             "continents $0.08 (a cluster file's egress_usd_per_gb overrides). Declare other sites under 'zones:'.",
    "models": "--model takes these names, Sailor's names, or a path to a config.json or model directory. The presets "
              "are Megatron-style builds, as the runs behind Sailor's profiles (llama-3-8b: full multi-head "
              "attention and GPT-2's vocabulary); for a released model's exact architecture pass its config.json.",
}


def add_parser(subparsers, add_common=None) -> argparse.ArgumentParser:
    p = subparsers.add_parser("list", help="list the built-in GPU types (memory, prices), zones and model presets",
                              description=__doc__.splitlines()[0])
    p.add_argument("what", choices=("gpus", "zones", "models"), help="what to list")
    p.add_argument("--cluster", metavar="FILE", help="include a cluster file's GPU types, zones and prices")
    p.add_argument("--json", action="store_true", help="print one JSON list instead of a table")
    p.set_defaults(func=cmd_list)
    return p
