"""examples/train_opt.sh on CPU: the heterogeneous 6-rank plan through torchrun, on a text file
(DATA_TEXT) that the script prepares with `sailor data prepare --tokenizer bytes`."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import pytest
from _runtime_helpers import ROOT, free_port

pytestmark = pytest.mark.slow


def test_example_trains_through_torchrun(tmp_path):
    text = tmp_path / "corpus.txt"
    text.write_text((ROOT / "README.md").read_text())
    env = {**os.environ, "PYTHON": sys.executable, "OUT": str(tmp_path), "ITERS": "3", "DEVICE": "cpu",
           "MASTER_PORT": str(free_port()), "PYTHONWARNINGS": "ignore", "DATA_TEXT": str(text)}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    out = subprocess.run(["bash", str(ROOT / "examples" / "train_opt.sh")], env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    metrics = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2, 3]
    assert all(m["samples_per_replica"] == [8, 4] and m["tokens"] == 12 * 64 for m in metrics)
    name, digest = (tmp_path / "ckpt" / "latest").read_text().split()  # the name and its meta.json's SHA-256
    assert name == "iter_0000003"
    assert digest == hashlib.sha256((tmp_path / "ckpt" / name / "meta.json").read_bytes()).hexdigest()
    assert (tmp_path / "corpus.bin").stat().st_size == 2 * len(text.read_bytes())  # uint16 bytes, no EOS
