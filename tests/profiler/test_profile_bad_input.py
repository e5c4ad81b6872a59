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
    (["--model", "tiny", "--gpu", "../../GG"], ["--gpu '../../GG' must be a GPU type name (no '/' or '..')"]),
    (["--model", "tiny", "--gpu", ".."], ["--gpu '..' must be a GPU type name"]),
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


def test_a_model_name_that_cannot_be_a_directory(tmp_path):
    """The name (here a config's _name_or_path) is a directory level of the output: '..' wrote beside it."""
    cfg = tmp_path / "config.json"
    cfg.write_text('{"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, '
                   '"num_attention_heads": 4, "vocab_size": 512, "max_position_embeddings": 128, '
                   '"_name_or_path": ".."}')
    one_line_error(sailor("profile", "model", "--model", cfg, "--device", "cpu", "-o", tmp_path / "out" / "p",
                          "--micro-batch-sizes", "1", "--warmup", "0", "--repeats", "1"),
                   f"--model {cfg}: its name '..' must be a model name other than '.' or '..'", "_name_or_path")
    assert list(tmp_path.iterdir()) == [cfg]  # nothing written
