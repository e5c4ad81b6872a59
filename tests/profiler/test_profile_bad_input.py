"""`sailor profile model`: every mistake is one line naming the problem and the fix, exit 2, before any work."""
from __future__ import annotations

import pytest
from _profiler_helpers import one_line_error, sailor


@pytest.mark.parametrize("args, needles", [
    (["--model", "gpt-9"], ["unknown model 'gpt-9'"]),
    (["--model", "tiny", "--tp", "3"], ["--tp: TP 3 does not divide", "4 attention heads"]),
    (["--model", "tiny", "--tp", "1,x"], ["argument --tp", "write comma-separated integers"]),
    (["--model", "tiny", "--micro-batch-sizes", "0,2"], ["argument --micro-batch-sizes", "must be from 1"]),
    (["--model", "tiny", "--device", "cuda"], ["no CUDA device", "--device cpu"]),
    (["--model", "tiny", "--repeats", "0"], ["--repeats"]),
    (["--model", "tiny", "--precision", "bf16"], ["fp32 on CPU"]),
    (["--model", "tiny", "--precision", "fp16"], ["fp32 on CPU"]),
])
def test_bad_model_input(tmp_path, args, needles):
    run = sailor("profile", "model", "--device", "cpu", *args, "-o", tmp_path)  # a later --device wins
    one_line_error(run, *needles)
    assert not any(tmp_path.iterdir())  # nothing written


def test_bad_model_config_file(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text('{"model_type": "bert"}')
    one_line_error(sailor("profile", "model", "--model", cfg, "--device", "cpu", "-o", tmp_path / "out"),
                   "model_type 'bert' is not supported")
