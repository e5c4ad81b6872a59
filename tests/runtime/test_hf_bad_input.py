"""Hugging Face weights and exports that cannot work: one clear line, exit 2, at once.

The run has two stages, so a mistake in the second stage's weights must stop
the first stage too (it would otherwise wait for its peer until --dist-timeout).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from _runtime_helpers import ROOT, plan_dict, run_plan
from test_bad_input import assert_one_clear_line

transformers = pytest.importorskip("transformers")

LLAMA = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             vocab_size=300, max_position_embeddings=64)


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("hf")
    transformers.AutoModelForCausalLM.from_config(transformers.LlamaConfig(**LLAMA)).save_pretrained(directory)
    return directory


def _copy(hf_dir, tmp_path, tensors=None, config=None):
    """A copy of the model directory with its tensors and/or config changed."""
    from safetensors.torch import load_file, save_file

    out = tmp_path / "hf"
    out.mkdir()
    weights = load_file(hf_dir / "model.safetensors")
    save_file(tensors(weights) if tensors else weights, out / "model.safetensors", {"format": "pt"})
    cfg = json.loads((hf_dir / "config.json").read_text())
    (out / "config.json").write_text(json.dumps(config(cfg) if config else cfg))
    return out


def _train(tmp_path, model_dir, load_dir, *extra):
    plan = plan_dict([((0, 1), [1]), ((2, 4), [1])], [(2, 2)], model=str(model_dir))  # llama: layers 0..4
    start = time.monotonic()
    run = run_plan(tmp_path / "run", plan, 2, ["--load-hf", str(load_dir), "--train-iters", "1", *extra], timeout=120)
    return run, time.monotonic() - start


def test_weights_shaped_for_another_config_name_the_tensor(hf_dir, tmp_path):
    def shrink(weights):  # the second stage's down projection loses a column
        name = "model.layers.1.mlp.down_proj.weight"
        weights[name] = weights[name][:, :-1].contiguous()
        return weights

    bad = _copy(hf_dir, tmp_path, tensors=shrink)
    run, seconds = _train(tmp_path, hf_dir, bad)
    assert run.returncodes == [2, 2]
    assert_one_clear_line(run.log(0), "rank 1", "model.layers.1.mlp.down_proj.weight (64, 95)",
                          "mlp.linear_fc2.weight of shape (64, 96)")
    assert run.log(1) == "" or "sailor: error" not in run.log(1)  # rank 0 alone reports it
    assert seconds < 60


def test_missing_tensor_is_named(hf_dir, tmp_path):
    bad = _copy(hf_dir, tmp_path, tensors=lambda w: {k: v for k, v in w.items() if k != "model.norm.weight"})
    run, _ = _train(tmp_path, hf_dir, bad)
    assert run.returncodes == [2, 2]
    assert_one_clear_line(run.log(0), "have no tensor model.norm.weight")


def test_weights_of_another_architecture(hf_dir, tmp_path):
    other = _copy(hf_dir, tmp_path, config=lambda c: {**c, "intermediate_size": 128})
    run, _ = _train(tmp_path, hf_dir, other)
    assert run.returncodes == [2, 2]
    assert_one_clear_line(run.log(0), "has ffn_hidden 128", "has 96", "plan with --model")


def test_config_tying_a_checkpoints_own_head_is_refused(hf_dir, tmp_path):
    """tie_word_embeddings true over a checkpoint with its own lm_head (as a re-saved Mistral Small 3.1's is)
    would train without that head: refused, naming the fix. A head equal to the embeddings loads."""
    tied = lambda c: {**c, "tie_word_embeddings": True}  # noqa: E731
    bad = _copy(hf_dir, tmp_path, config=tied)
    run, _ = _train(tmp_path, bad, bad)
    assert run.returncodes == [2, 2]
    assert_one_clear_line(run.log(0), "hold their own lm_head.weight, unlike model.embed_tokens.weight",
                          "set tie_word_embeddings to false")
    (tmp_path / "same").mkdir()
    same = _copy(hf_dir, tmp_path / "same", config=tied, tensors=lambda w: {
        **w, "lm_head.weight": w["model.embed_tokens.weight"].clone()})
    run, _ = _train(tmp_path / "same", same, same)
    assert run.returncodes == [0, 0], run.log(0)


def test_directory_without_safetensors(hf_dir, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "config.json").write_text((hf_dir / "config.json").read_text())
    run, _ = _train(tmp_path, hf_dir, empty)
    assert run.returncodes == [2, 2]
    assert_one_clear_line(run.log(0), "no Hugging Face weights in", "model.safetensors")


def test_sequence_longer_than_the_context(hf_dir, tmp_path):
    run, _ = _train(tmp_path, hf_dir, hf_dir, "--seq-length", "128")
    assert run.returncodes == [2, 2]
    assert_one_clear_line(run.log(0), "--seq-length 128 exceeds the context length 64")


def _export(*args):
    return subprocess.run([sys.executable, "-m", "planner.cli", "export", *map(str, args)], capture_output=True,
                          text=True, cwd=ROOT, timeout=120)


@pytest.mark.parametrize("case", ["missing", "overlap", "occupied", "config-only", "fifo"])
def test_export_refuses_with_one_line(case, tmp_path):
    ckpt = tmp_path / "ckpt"
    if case == "missing":
        done = _export(ckpt, "--to-hf", tmp_path / "out")
        needle = "ckpt does not exist"
    elif case == "fifo":  # a `latest` that is a FIFO was read, and the export waited for a writer for ever; it is a
        # damaged pointer now (the checkpoints beside it would be read)
        ckpt.mkdir()
        os.mkfifo(ckpt / "latest")
        done = _export(ckpt, "--to-hf", tmp_path / "out")
        needle = "no checkpoint in"
    else:
        ckpt.mkdir()
        if case == "overlap":
            done = _export(ckpt, "--to-hf", ckpt / "hf")
            needle = "overlaps the checkpoint"
        else:
            (tmp_path / "out").mkdir()  # (a config.json alone was overwritten)
            (tmp_path / "out" / ("model.safetensors" if case == "occupied" else "config.json")).write_bytes(b"x")
            done = _export(ckpt, "--to-hf", tmp_path / "out")
            needle = "already holds a model (safetensors files or a config.json)"
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("sailor: error:") and needle in done.stderr, \
        done.stderr


@pytest.mark.parametrize("index", [{"weight_map": []}, {"weight_map": "model.safetensors"},
                                   {"weight_map": {"w": 3}}, {"weight_map": {"w": "../../x.safetensors"}}, "dir"],
                         ids=["list", "string", "int-file", "outside", "index-a-directory"])
def test_a_malformed_safetensors_index_is_one_line(tmp_path, index):
    """A weight_map that is not {tensor: file.safetensors} crashed (AttributeError, TypeError) or named files
    outside the directory."""
    from planner.errors import SailorError
    from sailor_ext.hf import INDEX_FILE, HFWeights

    if index == "dir":
        (tmp_path / INDEX_FILE).mkdir()
    else:
        (tmp_path / INDEX_FILE).write_text(json.dumps(index))
    with pytest.raises(SailorError, match=INDEX_FILE.replace(".", r"\.")) as e:
        HFWeights(tmp_path)
    assert "\n" not in str(e.value)


def test_integer_weights_are_refused(tmp_path):
    """int64 tensors loaded as weights trained to a NaN loss, exit 0."""
    import torch
    from safetensors.torch import save_file

    from planner.errors import SailorError
    from sailor_ext.hf import HFWeights

    save_file({"w": torch.ones(2, 2, dtype=torch.int64)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(SailorError, match="w holds torch.int64 values, not floating-point weights"):
        HFWeights(tmp_path).get("w")


_EXPERTS = "model.layers.0.mlp.experts.down_proj"


@pytest.mark.parametrize("blocks, scales, needle", [
    ((2, 8, 2, 16), (2, 8), "are not MXFP4"),  # scales with fewer dimensions (an IndexError)
    ((2, 8, 2, 16), (2, 9, 2), "are not MXFP4"),  # more rows of scales than of blocks (read past unnoticed)
    ((2, 8, 2, 8), (2, 8, 2), "are not MXFP4"),  # 16 values per block, not 32
    ((2, 8, 2, 16), "float", "hold torch.uint8 and torch.float32"),
    ((2, 8, 2, 16), 255, "holds 255, MXFP4's NaN"),  # (dequantized to inf: a NaN loss, exit 0)
], ids=["scales-2d", "scales-more-rows", "half-blocks", "float-scales", "nan-scale"])
def test_malformed_mxfp4_experts_are_one_line(tmp_path, blocks, scales, needle):
    """gpt-oss's MXFP4 expert tensors that are not MXFP4: one line naming the tensors."""
    import torch
    from safetensors.torch import save_file

    from planner.errors import SailorError
    from sailor_ext.hf import HFWeights

    tensors = {f"{_EXPERTS}_blocks": torch.zeros(blocks, dtype=torch.uint8)}
    tensors[f"{_EXPERTS}_scales"] = torch.zeros(blocks[:-1]) if scales == "float" else \
        torch.full(blocks[:-1], 255, dtype=torch.uint8) if scales == 255 else torch.zeros(scales, dtype=torch.uint8)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(SailorError, match=needle) as e:
        HFWeights(tmp_path).get(_EXPERTS, 1, 0, 40)
    assert "\n" not in str(e.value)


def test_an_index_naming_the_wrong_file_is_one_line(tmp_path):
    """An index that places a tensor in a shard that lacks it raised safetensors' own error."""
    import torch
    from safetensors.torch import save_file

    from planner.errors import SailorError
    from sailor_ext.hf import INDEX_FILE, HFWeights

    save_file({"a": torch.ones(2)}, str(tmp_path / "a.safetensors"))
    save_file({"b": torch.ones(2)}, str(tmp_path / "b.safetensors"))
    (tmp_path / INDEX_FILE).write_text(json.dumps({"weight_map": {"a": "a.safetensors", "b": "a.safetensors"}}))
    with pytest.raises(SailorError, match="a.safetensors holds no tensor b, which model.safetensors.index.json "
                                          "places there"):
        HFWeights(tmp_path).get("b")


@pytest.mark.parametrize("scale, block, needle", [
    (None, [8, 8], "holds torch.float8_e4m3fn values without a w.weight_scale_inv of the (2, 3) blocks of 8 x 8"),
    ((2, 2), [8, 8], "without a w.weight_scale_inv of the (2, 3) blocks"),  # a grid of other blocks
    ((2, 3), [8, 0], "weight_block_size must be two positive integers, not [8, 0]"),
    ((2, 3), "8x8", "weight_block_size must be two positive integers, not '8x8'"),
], ids=["no-scales", "other-grid", "zero-block", "string-block"])
def test_malformed_fp8_weights_are_one_line(tmp_path, scale, block, needle):
    """FP8 weights without the scales of their blocks were read as their bare FP8 values (silently wrong)."""
    import torch
    from safetensors.torch import save_file

    from planner.errors import SailorError
    from sailor_ext.hf import HFWeights

    tensors = {"w.weight": torch.zeros(12, 20).to(torch.float8_e4m3fn)}
    if scale is not None:
        tensors["w.weight_scale_inv"] = torch.ones(scale)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({"quantization_config": {"quant_method": "fp8",
                                                                              "weight_block_size": block}}))
    with pytest.raises(SailorError, match=needle.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")) as e:
        HFWeights(tmp_path).get("w.weight", 0, 0, 4)
    assert "\n" not in str(e.value)


def test_fp8_blocks_cut_short_by_the_edge_take_their_scale(tmp_path):
    """DeepSeek's matrices need not fill their last blocks (kv_a_proj_with_mqa: 576 rows in blocks of 128): each
    element takes the scale of the block that holds it, whole and in slices (element by element here)."""
    import torch
    from safetensors.torch import save_file

    from sailor_ext.hf import HFWeights

    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(12, 20, generator=generator).to(torch.float8_e4m3fn)
    scale = torch.rand(2, 3, generator=generator) + 0.5
    save_file({"w.weight": weight, "w.weight_scale_inv": scale}, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({"quantization_config": {"quant_method": "fp8",
                                                                              "weight_block_size": [8, 8]}}))
    expected = torch.tensor([[weight[i, j].float().item() * scale[i // 8, j // 8].item() for j in range(20)]
                             for i in range(12)])
    ours = HFWeights(tmp_path)
    torch.testing.assert_close(ours.get("w.weight"), expected, rtol=1e-6, atol=0)
    torch.testing.assert_close(ours.get("w.weight", 0, 5, 12), expected[5:12], rtol=1e-6, atol=0)
    torch.testing.assert_close(ours.get("w.weight", 1, 7, 17), expected[:, 7:17], rtol=1e-6, atol=0)
