"""`sailor export CKPT --to-hf DIR`: a checkpoint of ours as a Hugging Face model directory.

Our checkpoints hold plan-independent logical tensors (sailor_ext/checkpoint.py),
so any checkpoint exports, whatever plan wrote it. The result is config.json
plus safetensors (sharded beyond 5 GB, with an index) that
`transformers.AutoModelForCausalLM.from_pretrained(DIR)` loads; the tokenizer
files of the Hugging Face model training started from (`--load-hf`), where
they are still there, are copied beside them.

Reading checkpoints needs torch (sailor_ext); this module imports it only when
the command runs.
"""
from __future__ import annotations

from pathlib import Path

from planner import flags
from planner.errors import SailorError
from planner.outputs import write_output

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt",
                   "tokenizer.model", "generation_config.json")
DTYPES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16",
          "float16": "float16", "fp16": "float16"}


def cmd_export(args) -> int:
    from planner.profile_cli import parse_size

    source, out = Path(args.checkpoint).resolve(), Path(args.to_hf).resolve()
    if not source.is_dir():
        what = "is not a directory" if source.exists() else "does not exist"
        raise SailorError(f"checkpoint {args.checkpoint} {what}; give a --save directory or one of its "
                          "iter_NNNNNNN directories")
    if out == source or source in out.parents or out in source.parents:
        raise SailorError(f"--to-hf {args.to_hf} overlaps the checkpoint {args.checkpoint}; write the export to a "
                          "directory of its own")
    if out.exists() and not out.is_dir():
        raise SailorError(f"--to-hf {args.to_hf} is a file; give a directory")
    if out.exists() and (any(out.glob("*.safetensors")) or (out / "config.json").exists()) and not args.force:
        raise SailorError(f"{args.to_hf} already holds a model (safetensors files or a config.json); choose an empty "
                          "directory or add --force")
    shard_bytes = parse_size(args.max_shard_size, "--max-shard-size")
    if shard_bytes <= 0:
        raise SailorError(f"--max-shard-size {args.max_shard_size} must be positive, e.g. 5GB")
    if args.tokenizer == "":
        raise SailorError("--tokenizer '' is empty; give the model directory holding the tokenizer files")
    if args.tokenizer and not Path(args.tokenizer).is_dir():
        raise SailorError(f"--tokenizer {args.tokenizer} is not a directory; give the model directory holding the "
                          "tokenizer files")
    if args.tokenizer and not any((Path(args.tokenizer) / name).is_file() for name in TOKENIZER_FILES):
        raise SailorError(f"--tokenizer {args.tokenizer} holds no tokenizer files ({', '.join(TOKENIZER_FILES[:2])}, "
                          "...); give the model directory that has them")
    flags.require_module("torch", "runtime", "sailor export")
    written, meta, model = _export(args.checkpoint, out, DTYPES[args.dtype], shard_bytes)
    copied = []
    source = meta.get("hf_source")  # the --load-hf directory the run started from, if any
    tokenizer = Path(args.tokenizer or (source if isinstance(source, str) else ""))
    if str(tokenizer) and tokenizer.is_dir():
        for name in TOKENIZER_FILES:
            if (tokenizer / name).is_file():
                write_output(out / name, (tokenizer / name).read_bytes(), what="tokenizer file")
                copied.append(name)
    print(f"exported {model.name} (step {meta['step']}, {model.total_params(padded=False):,} parameters, "
          f"{DTYPES[args.dtype]}) to {out}: {', '.join(p.name for p in written)}"
          + (f"; copied from {tokenizer}: {', '.join(copied)}" if copied else ""))
    return 0


def _export(path: str, out: Path, dtype_name: str, shard_bytes: int):
    """(files written, meta, model) of exporting a checkpoint, or one line saying why it cannot be exported.

    The checkpoint's own reader checks its layout and checksums; what it cannot know is whether files it
    never wrote (a foreign or hand-made directory) unpickle into the tensors the model needs. The
    conversion to Hugging Face tensors runs before anything is written, so a failure there leaves the
    output as it was."""
    import pickle
    import zipfile

    import torch

    from planner.inputs import Doc
    from planner.specs.model import get_model, model_from_dict
    from sailor_ext import checkpoint, hf

    unreadable = (pickle.UnpicklingError, EOFError, zipfile.BadZipFile, RuntimeError, KeyError, ValueError,
                  TypeError, IndexError, AttributeError)
    try:
        meta, logical = checkpoint.read_logical(path)
    except unreadable as e:
        raise SailorError(f"checkpoint {path} cannot be read ({type(e).__name__}: {' '.join(str(e).split())[:160]}); "
                          "it is damaged or was not written by sailor") from None
    where = f"checkpoint {path}: meta.json"
    top = Doc(meta, where).fields(("step",), open_ended=True)
    top["step"].int(0)
    if "model_config" in top:
        model = model_from_dict(meta["model_config"], where + " model_config")
    else:  # written before checkpoints carried the model: a preset by name
        name = top["model"].str() if "model" in top else ""
        model = get_model(name, seq_len=top["seq_len"].int(1, 1 << 24) if "seq_len" in top else None)
    held = {name.split(".")[1] for name in logical if name.count(".") >= 2}
    missing = [layer for layer in range(model.num_blocks + 1) if str(layer) not in held]  # embedding and blocks
    if missing:  # (a head may hold nothing of its own: tied to the embedding)
        raise SailorError(f"checkpoint {path} holds no tensor of layer {missing[0]}"
                          + (f" and {len(missing) - 1} more" if len(missing) > 1 else "")
                          + f" of {model.name}; it is incomplete or was saved for another model")
    try:
        return hf.export(logical, model, out, getattr(torch, dtype_name), shard_bytes), meta, model
    except unreadable as e:
        raise SailorError(f"checkpoint {path} does not hold {model.name}'s tensors ({type(e).__name__}: "
                          f"{' '.join(str(e).split())[:160]}); it is damaged or was saved for another model") from None


def add_parser(subparsers, add_common=None):
    p = subparsers.add_parser(
        "export", help="write a checkpoint as a Hugging Face model directory (safetensors + config.json)",
        description="Export a sailor checkpoint (any plan) so that transformers loads it with from_pretrained.")
    p.add_argument("checkpoint", help="checkpoint directory: a --save directory (its newest checkpoint that "
                                      "verifies) or one iter_NNNNNNN directory")
    p.add_argument("--to-hf", required=True, metavar="DIR", type=flags.nonempty("a directory"), help="output directory")
    p.add_argument("--dtype", default="float32", choices=sorted(DTYPES),
                   help="dtype of the written weights (default float32: the trained master weights)")
    p.add_argument("--max-shard-size", default="5GB", metavar="SIZE",
                   help="largest safetensors file; beyond it the weights are sharded with an index (default 5GB)")
    p.add_argument("--tokenizer", metavar="DIR", help="copy tokenizer files from this directory (default: the "
                                                      "--load-hf directory training started from, if it still exists)")
    p.add_argument("--force", action="store_true", help="write into a directory that already holds a model")
    p.add_argument("-q", "--quiet", action="store_true", help="print nothing but errors")
    p.set_defaults(func=cmd_export)
    return p
