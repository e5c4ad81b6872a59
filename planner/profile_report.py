"""`sailor profile show`: what a profiles directory says, as tables (rich) or one JSON object."""
from __future__ import annotations

from planner.profiles.collection import ProfileDir, network_entries
from planner.profiles.network_fits import BandwidthFit
from planner.profiles.profile import Profile, measured_model
from planner.report import console
from planner.specs.model import BLOCK, EMBEDDING, HEAD

MS = 1e3


def _layer_kinds(p: Profile) -> dict[str, int]:
    """Index of the embedding, the first block and the head (by the model's layout when known)."""
    model = measured_model(p.model, p.model_spec)
    if model is not None and model.num_layers == p.num_layers:
        kinds = [model.kind(i) for i in range(p.num_layers)]
    else:  # a model sailor does not know: assume embedding, blocks, head
        kinds = [EMBEDDING] + [BLOCK] * (p.num_layers - 2) + [HEAD]
    return {k: kinds.index(k) for k in (EMBEDDING, BLOCK, HEAD) if k in kinds}


def profile_summary(p: Profile) -> dict:
    idx = _layer_kinds(p)
    rows = []
    for (b, t), lt in sorted(p.times.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        total = sum(lt.fwd) + sum(lt.bwd)
        row = {"mbs": b, "tp": t, "total_s": total, "samples_per_s": b / total if total > 0 else None}
        for kind, i in idx.items():
            row[f"{kind}_fwd_s"], row[f"{kind}_bwd_s"] = lt.fwd[i], lt.bwd[i]
        rows.append(row)
    memory = []
    for t, m in sorted(p.memory.items()):
        row = {"tp": t, "params": sum(m.params), "activation_bytes_per_sample": sum(m.activation_bytes)}
        if BLOCK in idx:
            row["block_params"] = m.params[idx[BLOCK]]
            row["block_activation_bytes_per_sample"] = m.activation_bytes[idx[BLOCK]]
            row["output_bytes_per_sample"] = m.output_bytes[idx[BLOCK]]
        memory.append(row)
    return {"model": p.model, "gpu": p.gpu, "layers": p.num_layers, "precision": p.precision,
            "created": p.meta.get("created"), "software": p.meta.get("software"), "device": p.meta.get("device"),
            "optimizer_s_per_param": p.optimizer_s_per_param, "times": rows, "memory": memory}


PROBES = (2**16, 2**20, 2**24)


def _bandwidths(e: dict) -> dict:
    fit = BandwidthFit(*e["coeffs"], e["max_bytes_per_s"], e.get("latency_s"), e.get("min_bytes"), e.get("max_bytes"))
    probes = [*PROBES, e.get("max_bytes") or 1e9]
    return {f"{x:.0f}": fit.bytes_per_s(x) for x in probes}


def network_summary(d: ProfileDir) -> dict | None:
    intra, inter, allreduce = network_entries(d)
    if not intra and not inter:
        return None
    links = []
    for key, e in intra.items():
        links.append({"kind": "intra", "link": f"{key[0]} x{key[1]}", "latency_s": e.get("latency_s"),
                      "range_bytes": [e.get("min_bytes"), e.get("max_bytes")], "bytes_per_s": _bandwidths(e),
                      "allreduce_efficiency": e.get("allreduce_efficiency")})
    for key, e in inter.items():
        links.append({"kind": "inter", "link": f"{key[0]}/{key[1]} x{key[2]} -> {key[3]}/{key[4]} x{key[5]}",
                      "latency_s": e.get("latency_s"), "range_bytes": [e.get("min_bytes"), e.get("max_bytes")],
                      "bytes_per_s": _bandwidths(e), "allreduce_efficiency": e.get("allreduce_efficiency")})
    return {"links": links, "allreduce": [{"group": a["group"], "ranks": a["ranks"], "efficiency": a.get("efficiency")}
                                          for a in allreduce],
            "notes": (d.network or {}).get("notes", "")}


def dir_summary(d: ProfileDir) -> dict:
    return {"directory": str(d.root), "profiles": [profile_summary(p) for _, p in sorted(d.profiles.items())],
            "network": network_summary(d)}


def _size(x: float | None) -> str:
    if x is None:
        return "-"
    for unit, scale in (("GB", 2**30), ("MB", 2**20), ("KB", 2**10)):  # binary, as the size flags
        if x >= scale:
            return f"{x / scale:.3g} {unit}"
    return f"{x:g} B"


def print_summary(summary: dict) -> None:
    from rich.table import Table

    out = console()
    for p in summary["profiles"]:
        dev = p.get("device") or {}
        where = dev.get("name", "")
        if dev.get("type") == "cpu":
            where += f", {dev.get('threads_per_process')} thread(s) x {dev.get('concurrent_processes')} busy processes"
        sw = p.get("software") or {}
        out.print(f"[bold]{p['model']} on {p['gpu']}[/]: {p['layers']} layers, {p['precision']}, measured "
                  f"{p.get('created') or '?'}" + (f" on {where}" if where else "")
                  + (f" (torch {sw['torch']})" if sw.get("torch") else ""))
        t = Table(title="seconds per microbatch (ms)", title_justify="left")
        for col in ("TP", "mbs", "embedding f/b", "block f/b", "head f/b", "model f+b", "samples/s"):
            t.add_column(col, justify="right")
        for r in p["times"]:
            def fb(kind):
                f, b = r.get(f"{kind}_fwd_s"), r.get(f"{kind}_bwd_s")
                return "-" if f is None else f"{f * MS:.3f} / {b * MS:.3f}"
            t.add_row(str(r["tp"]), str(r["mbs"]), fb(EMBEDDING), fb(BLOCK), fb(HEAD), f"{r['total_s'] * MS:.2f}",
                      f"{r['samples_per_s']:.1f}" if r["samples_per_s"] else "-")
        out.print(t)
        m = Table(title="memory (per GPU of a TP group; activations per sample)", title_justify="left")
        for col in ("TP", "parameters", "per block", "activations", "per block", "block output"):
            m.add_column(col, justify="right")
        for r in p["memory"]:
            m.add_row(str(r["tp"]), f"{r['params'] / 1e6:.3f} M", f"{r.get('block_params', 0) / 1e6:.3f} M",
                      _size(r["activation_bytes_per_sample"]), _size(r.get("block_activation_bytes_per_sample")),
                      _size(r.get("output_bytes_per_sample")))
        out.print(m)
        out.print(f"optimizer step   {p['optimizer_s_per_param'] * 1e9:.3f} ns per parameter\n")
    net = summary["network"]
    if net:
        t = Table(title="network fits (GB/s at a message size per GPU)", title_justify="left")
        for col in ("kind", "link", "latency", "64 KB", "1 MB", "16 MB", "largest fitted", "fitted range",
                    "all-reduce eff."):
            t.add_column(col, justify="right" if col not in ("kind", "link") else "left")
        for link in net["links"]:
            bw = list(link["bytes_per_s"].values())
            lat = link["latency_s"]
            lo, hi = link["range_bytes"]
            eff = link.get("allreduce_efficiency")
            t.add_row(link["kind"], link["link"], "-" if lat is None else f"{lat * 1e6:.0f} us",
                      *(f"{x / 1e9:.3f}" for x in bw), f"{_size(lo)} .. {_size(hi)}" if lo else "64 KB .. 1 GB",
                      "default" if eff is None else f"{eff:.2f}")
        out.print(t)
        for a in net["allreduce"]:
            eff = a["efficiency"]
            out.print(f"all-reduce over {a['group']} (ranks {', '.join(map(str, a['ranks']))}): the ring model "
                      + (f"matches at efficiency {eff:.2f}" if eff else "has no fit to compare with"))
        if net.get("notes"):
            out.print(f"note: {net['notes']}")
    if not summary["profiles"] and not net:
        out.print(f"{summary['directory']}: empty")
