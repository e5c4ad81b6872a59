"""Why no plan was found (planner/search/explain.py): the memory it quotes is a placement the search could run."""
import json
import re
import subprocess
import sys
from pathlib import Path

from planner.search.space import capacity

ROOT = Path(__file__).resolve().parents[2]


def test_least_memory_counts_only_placements_the_gpus_hold(tmp_path):
    """A 12-layer model with 2 KV heads (TP at most 2) on 16 H100-80 (two nodes of 8): a pipeline of
    8 stages of TP 2 would fit in memory (77.0 GB), but deeper than a node it takes a node per stage
    (space.capacity), 8 nodes, so the search rightly finds no plan. The message quoted that placement,
    "still needs 77.0 GB on a H100-80 with 85.9 GB"; the best one the GPUs hold needs more than they have."""
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({
        "model_type": "llama", "hidden_size": 16384, "intermediate_size": 53248, "num_hidden_layers": 12,
        "num_attention_heads": 128, "num_key_value_heads": 2, "vocab_size": 32000, "max_position_embeddings": 4096}))
    out = subprocess.run([sys.executable, "-m", "planner.cli", "plan", "--model", str(model), "--gpus",
                          "H100-80@us-central1-a=16", "--global-batch", "64", "--seq-length", "4096",
                          "-o", str(tmp_path / "x.json")], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 2, out.stderr
    got = re.search(r"\((\d+) stages?, TP (\d+), .*\) still needs ([\d.]+) GB on a H100-80 with ([\d.]+) GB",
                    out.stderr)
    assert got, out.stderr
    stages, tp, need, have = int(got[1]), int(got[2]), float(got[3]), float(got[4])
    assert need > have and capacity(16, 8, stages, tp) >= 1, out.stderr
