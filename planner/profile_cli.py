"""`sailor profile`: measure models and networks on your own hardware, inspect and merge the results.

    sailor profile model --model NAME [--device cuda|cpu] [--micro-batch-sizes 1,2,4,8] [--tp 1,2,4] -o DIR
    sailor profile network -o FILE [--plot PNG] (under torchrun on each node, or --local N here)
    sailor profile show DIR [--json]
    sailor profile merge DIR1 DIR2 ... -o DIR

Measuring needs torch (sailor_ext.profile); this module only parses arguments,
starts processes and prints, so `show` and `merge` run on the planner's machine.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
from pathlib import Path

from planner import flags
from planner.errors import SailorError

UNITS = {"": 1, "B": 1, "K": 2**10, "KB": 2**10, "KIB": 2**10, "M": 2**20, "MB": 2**20, "MIB": 2**20,
         "G": 2**30, "GB": 2**30, "GIB": 2**30}


def parse_size(text: str, flag: str) -> int:
    m = re.fullmatch(r"\s*(\d{1,12}(?:\.\d+)?)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).upper() not in UNITS or float(m.group(1)) * UNITS[m.group(2).upper()] > 2**50:
        raise SailorError(f"{flag} takes a size like 1KB, 64MB or 1GB (binary units, up to 1PB), got {text!r}")
    return int(float(m.group(1)) * UNITS[m.group(2).upper()])





# -- sailor profile model ------------------------------------------------------------------
def cmd_model(args) -> int:
    from planner.profiles.profile import dir_level
    from planner.specs.model import canonical_name, get_model

    # a mistake in the model is one line before torch is imported; so are names that cannot be directories
    dir_level(canonical_name(get_model(args.model).name), f"--model {args.model}: its name", model=True)
    if args.gpu is not None:
        dir_level(args.gpu, "--gpu")
    if Path(args.output).exists() and not Path(args.output).is_dir():
        raise SailorError(f"-o {args.output} is a file; give the profiles directory to write into")
    flags.require_module("torch", "runtime", "sailor profile model")
    from sailor_ext.profile.model_profile import ModelProfileRequest, profile_model

    device = args.device
    if device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    req = ModelProfileRequest(
        model=args.model, out_dir=args.output, device=device, gpu=args.gpu,
        microbatch_sizes=args.micro_batch_sizes, tp_degrees=args.tp, warmup=args.warmup, repeats=args.repeats,
        blocks=args.blocks,
        threads=args.threads, concurrency=args.concurrency, precision=args.precision, seed=args.seed,
        resume=args.resume, timeout_s=args.timeout)
    if args.quiet:
        profile_model(req)
        return 0
    with _progress() as report:
        path = profile_model(req, report)
    print(f"profile written to {path}")
    from planner.profile_report import print_summary, profile_summary
    from planner.profiles.profile import load_profile_file

    print_summary({"directory": args.output, "profiles": [profile_summary(load_profile_file(path))],
                   "network": None})
    return 0


class _progress:
    """A rich progress bar on a terminal, one line per finished point otherwise."""

    def __enter__(self):
        if sys.stderr.isatty():
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                TimeElapsedColumn(), console=Console(stderr=True))
            self.bar.__enter__()
            self.task = self.bar.add_task("starting", total=None)
        else:
            self.bar = None
        return self.report

    def report(self, what: str, done: int, total: int) -> None:
        if self.bar is not None:
            self.bar.update(self.task, description=what, completed=done, total=total)
        else:
            print(f"[{done}/{total}] {what}", file=sys.stderr, flush=True)

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.__exit__(*exc)
        return False


# -- sailor profile network ------------------------------------------------------------------
def _network_config(args) -> dict:
    lo, hi = parse_size(args.min_size, "--min-size"), parse_size(args.max_size, "--max-size")
    if lo < 1 or hi < lo:
        raise SailorError(f"--min-size {args.min_size} must be positive and at most --max-size {args.max_size}")
    if hi < 2**20:
        raise SailorError(f"--max-size {args.max_size} is too small: the fit needs messages of 64 KB, 256 KB and "
                          "1 MB at least; use --max-size 1MB or more")
    if args.compute_between is not None and args.compute_between < 0:
        raise SailorError(f"--compute-between {args.compute_between:g} must be >= 0 (milliseconds)")
    return {"out": args.output, "plot": args.plot, "min_bytes": lo, "max_bytes": hi, "gpu": args.gpu,
            "zone": args.zone, "timeout_s": args.timeout,
            "compute_between_s": None if args.compute_between is None else args.compute_between / 1e3}


def _labels(text: str | None, n: int, flag: str, default, cast=str) -> list:
    if text is None:
        return [default] * n
    items = [x.strip() for x in text.split(",")]
    if len(items) != n:
        raise SailorError(f"{flag} lists {len(items)} values but --local starts {n} ranks; give one per rank")
    try:
        return [cast(x) for x in items]
    except ValueError:
        raise SailorError(f"{flag} takes comma-separated node numbers, e.g. 0,0,1,1 (got {text!r})") from None


def cmd_network(args) -> int:
    cfg = _network_config(args)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # one rank under torchrun
        from sailor_ext.profile.network import NetworkRequest, run

        doc = run(NetworkRequest(**cfg))
        if doc is not None:
            _print_network(args)
        return 0
    if not args.local:
        raise SailorError("start `sailor profile network` on every node through torchrun (torchrun --nnodes N "
                          "--nproc-per-node G -m planner.cli profile network -o FILE --zone ZONE), or measure "
                          "local processes with --local N")
    if args.local < 2:
        raise SailorError(f"--local {args.local}: a link needs two ends; use --local 2 or more")
    nodes = _labels(args.nodes, args.local, "--nodes", 0, int)
    zones = _labels(args.zones, args.local, "--zones", args.zone)
    for node in set(nodes):
        if len({z for n, z in zip(nodes, zones) if n == node}) > 1:
            raise SailorError(f"--zones puts ranks of node {node} in different zones; a node is in one zone")
    from sailor_ext.profile.ranks import run_local_ranks

    with tempfile.TemporaryDirectory(prefix="sailor-net-") as tmp:
        cfg_path = Path(tmp) / "network.json"
        cfg_path.write_text(json.dumps(cfg))

        def on_line(line: str) -> None:
            if not line.startswith("{"):
                print(line.rstrip(), file=sys.stderr, flush=True)

        run_local_ranks("sailor_ext.profile.network", cfg_path, args.local, on_line, Path(tmp), args.timeout,
                        "network profiling", lambda rank: {"SAILOR_NODE": str(nodes[rank]), "SAILOR_ZONE": zones[rank]})
    _print_network(args)
    return 0


def _print_network(args) -> None:
    from planner.profile_report import network_summary, print_summary
    from planner.profiles.collection import ProfileDir

    doc = json.loads(Path(args.output).read_text())
    d = ProfileDir(Path(args.output).parent, {}, doc)
    print(f"network fits written to {args.output}" + (f", plot in {args.plot}" if args.plot else ""))
    print_summary({"directory": str(d.root), "profiles": [], "network": network_summary(d)})


# -- show / merge ----------------------------------------------------------------------------
def cmd_show(args) -> int:
    from planner.profile_report import dir_summary, print_summary
    from planner.profiles.collection import read_dir

    d = read_dir(args.directory)
    if args.model or args.gpu:
        from planner.specs.model import canonical_name

        d.profiles = {k: p for k, p in d.profiles.items() if (not args.model or k[0] == canonical_name(args.model))
                      and (not args.gpu or k[1].lower() == args.gpu.lower())}
        if not d.profiles:
            raise SailorError(f"{args.directory} has no profile of {args.model or 'any model'} on "
                              f"{args.gpu or 'any GPU'}")
    summary = dir_summary(d)
    if args.json:
        print(json.dumps(summary, indent=1))
    else:
        print_summary(summary)
    return 0


def cmd_merge(args) -> int:
    from planner.profiles.collection import merge_dirs

    result = merge_dirs(args.directories, args.output, args.prefer, args.force)
    out = {"profiles": [str(p) for p in result.profiles], "network": str(result.network) if result.network else None,
           "combined": [f"{m} on {g}" for m, g in result.combined]}
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    print(f"merged {len(args.directories)} directories into {args.output}: {len(result.profiles)} profile(s)"
          + (", network.json" if result.network else "")
          + (f"; combined point by point: {', '.join(out['combined'])}" if result.combined else ""))
    return 0


def cmd_export(args) -> int:
    from planner.profiles.collection import read_dir
    from planner.profiles.sailor_data import save_sailor_dir

    src = read_dir(args.directory)
    out, root = Path(args.output).resolve(), src.root.resolve()
    if out == root or root in out.parents or out in root.parents:
        raise SailorError(f"the output {args.output} overlaps the source {args.directory}; export to a directory of "
                          "its own")
    if out.exists() and not out.is_dir():
        raise SailorError(f"the output {args.output} is a file; give a directory")
    if not src.profiles:
        raise SailorError(f"{args.directory} holds no model profiles to export (network fits stay in our format)")
    paths = save_sailor_dir([src.profiles[k] for k in sorted(src.profiles)], Path(args.output))
    print(f"wrote {len(paths)} profile(s) and llm_info.json in Sailor's layout under {args.output}")
    return 0


# -- argparse ----------------------------------------------------------------------------------
def add_parser(subparsers, add_common=None) -> argparse.ArgumentParser:
    p = subparsers.add_parser("profile", help="measure a model or the network on this hardware; show, merge or "
                              "export profiles", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="profile_command", required=True, metavar="WHAT", help="one of:")

    m = sub.add_parser("model", help="time the runtime's layers per microbatch size and TP degree",
                       description="Measure per-layer forward/backward time, memory and the optimizer step of a "
                                   "model with the training runtime's own layers; writes DIR/MODEL/GPU/profile.json.")
    m.add_argument("--model", required=True, help="model preset, config.json, or a plan file (its model)")
    m.add_argument("-o", "--output", required=True, metavar="DIR", type=flags.nonempty("a directory"),
                   help="profiles directory to write into")
    m.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"],
                   help="where to measure (default: cuda if visible, else cpu)")
    m.add_argument("--gpu", help="GPU type the profile is for (default: detected; CPU without CUDA)")
    m.add_argument("--micro-batch-sizes", default=(1, 2, 4, 8), type=flags.int_list(1, 1 << 16), metavar="1,2,4,8",
                   help="microbatch sizes to measure (default 1,2,4,8)")
    m.add_argument("--tp", default=(1,), type=flags.int_list(1, 64), metavar="1,2,4",
                   help="TP degrees (each runs that many processes; default 1)")
    m.add_argument("--resume", action="store_true", help="continue an interrupted run in DIR")
    m.add_argument("--warmup", type=flags.integer(0, 10**6), default=3, help="untimed repetitions first (default 3)")
    m.add_argument("--repeats", type=flags.integer(1, 10**6), default=20,
                   help="timed repetitions; the median is kept (default 20)")
    m.add_argument("--blocks", type=flags.integer(1, 4096), default=2,
                   help="transformer blocks to build and time (default 2)")
    m.add_argument("--threads", type=flags.integer(1, 1024), default=1,
                   help="CPU threads per process, as your training ranks use")
    m.add_argument("--concurrency", type=flags.integer(1, 1024), default=1,
                   help="CPU: processes busy at once while measuring, as many as the training ranks that will "
                        "share this machine (default 1)")
    m.add_argument("--precision", choices=["fp32", "bf16", "fp16"],
                   help="default: bf16 on CUDA, fp32 on CPU (the runtime's); fp16 for plans on GPUs without bf16 "
                        "(V100, T4, Turing)")
    m.add_argument("--seed", type=flags.integer(0, 2**32 - 1), default=1234, help="random seed of the inputs")
    m.add_argument("--timeout", type=flags.seconds, default=1800, help="seconds a profiling process may take")
    m.add_argument("-q", "--quiet", action="store_true", help="no progress and no summary; errors only")
    m.set_defaults(func=cmd_model)

    n = sub.add_parser("network", help="time p2p and all-reduce between ranks; fit the simulator's network model",
                       description="Run on every node through torchrun (torchrun --nnodes N --nproc-per-node G -m "
                                   "planner.cli profile network -o FILE --zone ZONE), or here with --local N.")
    n.add_argument("-o", "--output", required=True, metavar="FILE", type=flags.nonempty("a file"),
                   help="network.json to write (put it in a "
                   "profiles directory for --profiles)")
    n.add_argument("--plot", metavar="PNG", help="plot the fits against the measurements")
    n.add_argument("--local", type=flags.integer(1, 1024), metavar="N", help="start N processes on this machine")
    n.add_argument("--nodes", metavar="0,0,1,1", help="with --local: the node label of each rank (default all 0)")
    n.add_argument("--zones", metavar="Z,Z,...", help="with --local: the zone of each rank (default --zone)")
    n.add_argument("--zone", default="local", help="this node's zone (under torchrun; default 'local')")
    n.add_argument("--gpu", help="GPU type label (default: detected; CPU without CUDA)")
    n.add_argument("--min-size", default="1KB", help="smallest message (default 1KB)")
    n.add_argument("--max-size", default="64MB", help="largest message (default 64MB; 1GB on GPUs with memory)")
    n.add_argument("--compute-between", type=flags.number(0.0, 1e6), metavar="MS",
                   help="milliseconds of matrix multiplications before each timed transfer, as in training "
                        "(default 2 on CPU, 0 on GPUs)")
    n.add_argument("--timeout", type=flags.seconds, default=600, help="seconds the measurement may take "
                   "(default 600)")
    n.set_defaults(func=cmd_network)

    s = sub.add_parser("show", help="summarise a profiles directory")
    s.add_argument("directory", help="a profiles directory (ours or Sailor's layout)")
    s.add_argument("--model", help="only this model")
    s.add_argument("--gpu", help="only this GPU type")
    s.add_argument("--json", action="store_true", help="one JSON object instead of tables")
    s.set_defaults(func=cmd_show)

    g = sub.add_parser("merge", help="combine profiles directories from several machines into one")
    g.add_argument("directories", nargs="+", metavar="DIR", help="profiles directories to merge (two or more)")
    g.add_argument("-o", "--output", required=True, metavar="DIR", type=flags.nonempty("a directory"),
                   help="directory to write the merge into")
    g.add_argument("--prefer", choices=["first", "last"], help="which source wins where two measured the same point")
    g.add_argument("--force", action="store_true", help="replace profiles already in the output directory")
    g.add_argument("--json", action="store_true", help="print one JSON object instead of a line")
    g.set_defaults(func=cmd_merge)

    x = sub.add_parser("export", help="write a profiles directory in Sailor's layout, for Sailor's own planner")
    x.add_argument("directory", help="a profiles directory in our layout")
    x.add_argument("-o", "--output", required=True, metavar="DIR", type=flags.nonempty("a directory"),
                   help="writes DIR/profiles/MODEL/GPU/profile.json "
                   "and DIR/llm_info.json (models already there are kept)")
    x.add_argument("--format", default="sailor", choices=["sailor"], help="target layout (default sailor)")
    x.set_defaults(func=cmd_export)
    return p
