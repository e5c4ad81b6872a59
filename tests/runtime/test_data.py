"""Real training data: `sailor data prepare` writes megatron-core's indexed dataset, training reads it
(and Megatron's own), split, blended and validated as Megatron does; bad data is one clear line.

The tokenizers are trained here, on a few KB of text (no downloads): a byte-level BPE of 300 tokens
(fits the `tiny` model's 512) and a word-level one of 700 (does not).
"""
from __future__ import annotations

import json
import random
import subprocess
import sys

import numpy as np
import pytest
from _runtime_helpers import ROOT, assert_ok, plan_dict, run_plan

from planner.cli import main as sailor

EOS = "<|endoftext|>"
WORDS = ("sailor plans training over many kinds of GPUs in several zones and picks the stages replicas "
         "microbatches that make each step fast and cheap while spot nodes come and go").split()


def sentences(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 14))) + "." for _ in range(n)]


@pytest.fixture(scope="module")
def bpe(tmp_path_factory):
    """A tokenizer.json: byte-level BPE, 300 tokens, end-of-document token <|endoftext|>."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(sentences(300), trainers.BpeTrainer(
        vocab_size=300, special_tokens=[EOS], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    path = tmp_path_factory.mktemp("bpe") / "tokenizer.json"
    tok.save(str(path))
    return path


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, bpe):
    """A JSONL corpus of 200 documents, prepared with the BPE tokenizer (PREFIX, documents)."""
    work = tmp_path_factory.mktemp("corpus")
    docs = sentences(200, seed=1)
    (work / "docs.jsonl").write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(docs)))
    assert sailor(["data", "prepare", str(work / "docs.jsonl"), "-o", str(work / "corpus"),
                   "--tokenizer", str(bpe)]) == 0
    return str(work / "corpus"), docs


def read_back(prefix: str) -> list[list[int]]:
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    data = IndexedDataset(prefix)
    assert list(data.document_indices) == list(range(len(data) + 1))  # one sequence per document
    return [data[i].tolist() for i in range(len(data))]


def megatron_built(prefix, documents: list[np.ndarray], dtype=np.int32) -> str:
    """An indexed dataset written by megatron-core's own builder, as Megatron-LM's preprocessing does."""
    import torch
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=dtype)
    for doc in documents:
        builder.add_item(torch.from_numpy(doc))
        builder.end_document()
    builder.finalize(f"{prefix}.idx")
    return str(prefix)


def one_error_line(capsys, *fragments: str) -> None:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("sailor: error: "), err
    for fragment in fragments:
        assert fragment in err, err


# -- sailor data prepare -----------------------------------------------------------------------
def test_prepare_text_and_jsonl_are_the_tokenizers_encodings(tmp_path, bpe, capsys):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(bpe))
    eos = tok.token_to_id(EOS)
    text, lines = "\n".join(sentences(5, seed=2)), sentences(7, seed=3)
    (tmp_path / "a.txt").write_text(text)
    (tmp_path / "b.jsonl").write_text("".join(json.dumps({"body": t}) + "\n\n" for t in lines))  # blank lines skipped
    capsys.readouterr()
    assert sailor(["data", "prepare", str(tmp_path / "a.txt"), str(tmp_path / "b.jsonl"), "-o",
                   str(tmp_path / "out" / "c"), "--tokenizer", str(bpe), "--json-key", "body"]) == 0
    out = capsys.readouterr().out
    assert "prepared 8 documents" in out and "vocabulary 300" in out and "c.bin" in out and "c.idx" in out
    expected = [tok.encode(t).ids + [eos] for t in [text, *lines]]
    assert read_back(str(tmp_path / "out" / "c")) == expected
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["c.bin", "c.idx"]  # nothing else of ours


def test_prepare_with_a_model_directory(tmp_path, bpe):
    """A local model directory goes through transformers' AutoTokenizer, EOS from its tokenizer_config.json."""
    from transformers import AutoTokenizer

    model = tmp_path / "model"
    model.mkdir()
    (model / "tokenizer.json").write_text(bpe.read_text())
    (model / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast",
                                                             "eos_token": EOS}))
    docs = sentences(4, seed=4)
    (tmp_path / "d.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in docs))
    assert sailor(["data", "prepare", str(tmp_path / "d.jsonl"), "-o", str(tmp_path / "d"), "--tokenizer",
                   str(model)]) == 0
    hf = AutoTokenizer.from_pretrained(str(model), local_files_only=True)
    assert read_back(str(tmp_path / "d")) == [hf(t)["input_ids"] + [hf.eos_token_id] for t in docs]


def test_prepare_bytes_needs_no_tokenizer_files(tmp_path):
    (tmp_path / "t.txt").write_text("héllo, sailor\n")
    assert sailor(["data", "prepare", str(tmp_path / "t.txt"), "-o", str(tmp_path / "t"), "-q"]) == 0
    assert read_back(str(tmp_path / "t")) == [list("héllo, sailor\n".encode())]  # no EOS: all 256 ids are bytes


def test_a_failed_prepare_leaves_outputs_and_inputs_as_they_were(tmp_path, capsys):
    good = tmp_path / "good.txt"
    good.write_text("first version")
    assert sailor(["data", "prepare", str(good), "-o", str(tmp_path / "c"), "-q"]) == 0
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"text": "also fine"}\n{"text": oops}\n')
    before[bad.name] = bad.read_bytes()
    assert sailor(["data", "prepare", str(good), str(bad), "-o", str(tmp_path / "c")]) == 2
    one_error_line(capsys, f"{bad}:3 is not JSON")
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before  # no temporary files left either


@pytest.mark.parametrize("case, fragments", [
    ("missing tokenizer", ["tokenizer", "not found", "tokenizer.json"]),
    ("unreadable tokenizer", ["is not a tokenizer the tokenizers library can read"]),
    ("tokenizer without a vocabulary", ["tokenizer.json has an empty vocabulary"]),  # (max() of nothing)
    ("model directory without tokenizer", ["cannot load a tokenizer from directory"]),
    ("empty text file", ["empty.txt is empty"]),
    ("empty JSONL file", ["empty.jsonl is empty"]),
    ("line that is not JSON", ["docs.jsonl:2 is not JSON"]),
    ("line without the key", ["docs.jsonl:1 has no key 'text'", "--json-key"]),
    ("output that is an input", ["is the input", "choose another -o"]),
    ("missing input", ["input", "nope.txt not found"]),
    ("line nested too deeply", ["docs.jsonl:2 is not JSON (nested too deeply); every line of a JSONL file"]),
    ("line with a huge integer", ["docs.jsonl:2 is not JSON (a number of more than 4300 digits)"]),
    ("line with a lone surrogate", ["docs.jsonl:2: 'text' is not valid UTF-8 text (a lone \\ud800 escape"]),
    ("output prefix empty", ["-o '' is empty; give a prefix like data/train"]),
    ("output prefix blank", ["-o ' ' is empty; give a prefix like data/train"]),
    ("output prefix dir/", ["-o 'sub/' names a directory", "like sub/train"]),
    ("output prefix .", ["-o '.' names a directory", "like ./train"]),
    ("output prefix ..", ["-o 'sub/..' names a directory", "like sub/../train"]),
])
def test_prepare_bad_input_is_one_line(tmp_path, capsys, monkeypatch, case, fragments):
    text = tmp_path / "t.txt"
    text.write_text("some text")
    args = [str(text), "-o", str(tmp_path / "out")]
    if case == "missing tokenizer":
        args += ["--tokenizer", str(tmp_path / "tokenizer.json")]
    elif case == "unreadable tokenizer":
        (tmp_path / "tokenizer.json").write_text('{"not": "a tokenizer"}')
        args += ["--tokenizer", str(tmp_path / "tokenizer.json")]
    elif case == "tokenizer without a vocabulary":
        from tokenizers import Tokenizer, models

        Tokenizer(models.WordLevel(vocab={}, unk_token="<unk>")).save(str(tmp_path / "tokenizer.json"))
        args += ["--tokenizer", str(tmp_path / "tokenizer.json")]
    elif case == "model directory without tokenizer":
        (tmp_path / "model").mkdir()
        args += ["--tokenizer", str(tmp_path / "model")]
    elif case.startswith("empty"):
        empty = tmp_path / ("empty.txt" if "text" in case else "empty.jsonl")
        empty.write_text("\n\n")
        args[0] = str(empty)
    elif case.startswith("line"):
        docs = tmp_path / "docs.jsonl"
        docs.write_text({"line that is not JSON": '{"text": "a"}\n[1, 2\n',
                         "line nested too deeply": '{"text": "a"}\n' + "[" * 100000 + "]" * 100000 + "\n",
                         "line with a huge integer": '{"text": "a"}\n{"text": "b", "n": 1' + "0" * 5000 + "}\n",
                         "line with a lone surrogate": '{"text": "a"}\n{"text": "x\\ud800y"}\n',
                         }.get(case, '{"body": "a"}\n'))
        args[0] = str(docs)
    elif case.startswith("output prefix"):  # relative to the working directory, where nothing may appear
        (tmp_path / "sub").mkdir()
        monkeypatch.chdir(tmp_path)
        args[2] = {"empty": "", "blank": " ", "dir/": "sub/", ".": ".", "..": "sub/.."}[case.split()[-1]]
    elif case == "output that is an input":
        (tmp_path / "corpus.bin").write_text("text that happens to be named .bin")
        args = [str(tmp_path / "corpus.bin"), "-o", str(tmp_path / "corpus")]
    elif case == "missing input":
        args[0] = str(tmp_path / "nope.txt")
    inputs = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    capsys.readouterr()
    assert sailor(["data", "prepare", *args]) == 2
    one_error_line(capsys, *fragments)
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == inputs


def test_prepare_error_from_a_fresh_process_is_one_line(tmp_path):
    docs = tmp_path / "docs.jsonl"
    docs.write_text('{"text": "a"}\n{"txt": "b"}\n')
    out = subprocess.run([sys.executable, "-m", "planner.cli", "data", "prepare", str(docs), "-o",
                          str(tmp_path / "c")], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 2 and out.stdout == "", out
    assert out.stderr.count("\n") == 1 and f"{docs}:2 has no key 'text'" in out.stderr, out.stderr


# -- samples -----------------------------------------------------------------------------------
def test_samples_are_windows_of_the_split_shuffled_per_epoch(corpus):
    from sailor_ext.data import open_data, parse_split, split_documents

    prefix, docs = corpus
    ids = read_back(prefix)
    shares = parse_split("80,20,0")
    a = open_data([prefix], "80,20,0", 512, 16, seed=3, validation=True)
    b = open_data([prefix], "80,20,0", 512, 16, seed=3, validation=True)
    for source, which in ((a.train, 0), (a.validation, 1)):
        stream = np.concatenate([ids[d] for d in split_documents(len(docs), shares, which)])
        windows = sorted(tuple(stream[j * 16: j * 16 + 17]) for j in range((len(stream) - 1) // 16))
        n = source.num_samples
        assert sorted(tuple(source.sample(i)) for i in range(n)) == windows  # every window once per epoch
        assert sorted(tuple(source.sample(n + i)) for i in range(n)) == windows
        assert [tuple(source.sample(i)) for i in range(n)] != [tuple(source.sample(n + i)) for i in range(n)]
    assert all(np.array_equal(a.train.sample(i), b.train.sample(i)) for i in range(50))


def test_split_rounds_as_megatron_does():
    from megatron.core.datasets.blended_megatron_dataset_config import (convert_split_vector_to_split_matrix,
                                                                         parse_and_normalize_split)

    from sailor_ext.data import parse_split, split_documents

    for text in ("969,30,1", "90,10,0", "1,1,1", "100", "7,2"):
        matrix = convert_split_vector_to_split_matrix(parse_and_normalize_split(text))
        for n in (1, 7, 200, 1001):
            for which, bookends in enumerate(matrix):
                ours = split_documents(n, parse_split(text), which)
                theirs = range(0) if bookends is None else range(int(round(bookends[0] * n)),
                                                                 int(round(bookends[1] * n)))
                assert len(ours) == len(theirs) == 0 or ours == theirs, (text, n, which)


def test_blending_follows_the_weights(tmp_path):
    """Two datasets of Megatron's own making with disjoint token ids: a 0.3/0.7 blend takes exactly 300 and
    700 of the first 1000 samples from them, and within one sample per dataset at every prefix."""
    from sailor_ext.data import open_data

    rng = np.random.default_rng(0)
    low = megatron_built(tmp_path / "low", [rng.integers(0, 100, 50) for _ in range(40)])
    high = megatron_built(tmp_path / "high", [rng.integers(100, 200, 50) for _ in range(40)], dtype=np.uint16)
    data = open_data(["0.3", low, "0.7", high], "100", 512, 16, seed=1, validation=False)
    from_low = np.array([data.train.sample(i).max() < 100 for i in range(10000)])
    assert from_low[:1000].sum() == 300
    counts = np.cumsum(from_low)
    assert np.all(np.abs(counts - 0.3 * np.arange(1, 10001)) <= 1 + np.arange(10000) // 4096)
    by_size = open_data([low, high], "100", 512, 16, seed=1, validation=False)  # no weights: by size (equal)
    assert sum(by_size.train.sample(i).max() < 100 for i in range(100)) == 50


# -- bad data at training start ----------------------------------------------------------------
def train_main(args: list[str]) -> int:
    from sailor_ext.train import main

    return main(["--model", "tiny", "--train-iters", "1", "--global-batch-size", "2", *args])


@pytest.fixture(scope="module")
def wide_vocab_data(tmp_path_factory):
    """Data tokenized with a 700-word vocabulary, more than tiny's 512."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    work = tmp_path_factory.mktemp("wide")
    words = [f"w{i}" for i in range(698)]
    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator([" ".join(words)], trainers.WordLevelTrainer(vocab_size=700, special_tokens=["<unk>", EOS]))
    tok.save(str(work / "tokenizer.json"))
    (work / "words.txt").write_text(" ".join(words))
    assert sailor(["data", "prepare", str(work / "words.txt"), "-o", str(work / "wide"), "--tokenizer",
                   str(work / "tokenizer.json"), "-q"]) == 0
    return str(work / "wide")


@pytest.mark.parametrize("case, fragments", [
    ("vocabulary too large", ["holds token id 699", "vocabulary has 512", "model's tokenizer"]),
    ("no .idx", ["x.idx not found", "sailor data prepare"]),
    ("no .bin", ["x.bin not found"]),
    ("weight without prefix", ["--data-path 0.3 {prefix} 0.7", "a weight before each prefix"]),
    ("negative weight", ["the weight -0.5 of", "non-negative"]),
    ("malformed split", ["--split '90;10'", "e.g. 969,30,1"]),
    ("too few tokens", ["shorter than one sample of 65 tokens", "--seq-length"]),
    ("empty validation split", ["its validation split", "0 of 1 documents", "--eval-interval"]),
    ("bad eval interval", ["argument --eval-interval: must be a positive integer"]),
    ("truncated .idx", ["x.idx is not a megatron indexed dataset index"]),
    ("negative offset", ["x.idx holds a negative offset or length"]),
])
def test_bad_data_is_one_line_before_training(tmp_path, capsys, corpus, wide_vocab_data, case, fragments):
    prefix = corpus[0]
    if case == "no .bin":
        (tmp_path / "x.idx").write_bytes(open(prefix + ".idx", "rb").read())
    if case in ("truncated .idx", "negative offset"):  # (a struct.error or numpy's ValueError escaped before)
        idx = bytearray(open(prefix + ".idx", "rb").read())
        count = int.from_bytes(idx[18:26], "little")  # magic 9 B, version 8 B, dtype 1 B, then the sequence count
        idx = idx[:12] if case == "truncated .idx" else \
            idx[:34 + 4 * count] + (-8).to_bytes(8, "little", signed=True) + idx[34 + 4 * count + 8:]
        (tmp_path / "x.idx").write_bytes(idx)
        (tmp_path / "x.bin").write_bytes(open(prefix + ".bin", "rb").read())
    if case in ("too few tokens", "empty validation split"):  # one document: nothing for validation
        (tmp_path / "t.txt").write_text("too short" if case == "too few tokens" else "long enough " * 50)
        assert sailor(["data", "prepare", str(tmp_path / "t.txt"), "-o", str(tmp_path / "one"), "-q"]) == 0
    args = {
        "vocabulary too large": ["--data-path", wide_vocab_data],
        "no .idx": ["--data-path", str(tmp_path / "x")],
        "no .bin": ["--data-path", str(tmp_path / "x")],
        "weight without prefix": ["--data-path", "0.3", prefix, "0.7"],
        "negative weight": ["--data-path", "-0.5", prefix, "1.5", prefix],
        "malformed split": ["--data-path", prefix, "--split", "90;10"],
        "too few tokens": ["--data-path", str(tmp_path / "one")],
        "empty validation split": ["--data-path", str(tmp_path / "one"), "--eval-interval", "1"],
        "bad eval interval": ["--eval-interval", "0"],
        "truncated .idx": ["--data-path", str(tmp_path / "x")], "negative offset": ["--data-path", str(tmp_path / "x")],
    }[case]
    inputs = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    capsys.readouterr()
    assert train_main(args) == 2
    one_error_line(capsys, *[f.replace("{prefix}", prefix) for f in fragments])
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == inputs


def test_bad_data_stops_every_rank_before_the_process_group(tmp_path, corpus):
    run = run_plan(tmp_path, plan_dict([((0, 2), [1]), ((3, 5), [1])], [(2, 2)]), 2,
                   ["--train-iters", "1", "--data-path", corpus[0], "--split", "0,1"], timeout=120)
    assert run.returncodes == [2, 2]
    lines = [line for line in run.log(0).splitlines() if line.startswith("sailor: error:")]
    assert len(lines) == 1 and "its train split" in lines[0], run.log(0)
    assert "Traceback" not in run.log(0) + run.log(1) and "sailor: error" not in run.log(1)


# -- training ----------------------------------------------------------------------------------
SGD = ["--optimizer", "sgd", "--sgd-momentum", "0", "--lr", "0.5", "--clip-grad", "0.5"]
EVAL = ["--train-iters", "4", "--eval-interval", "2", "--eval-iters", "2", "--split", "80,20,0", "--seed", "5",
        "--dist-timeout", "60", *SGD]


@pytest.mark.slow
def test_training_on_prepared_data_validates_and_is_plan_independent(runs_dir, corpus):
    """Two stages (two processes) and one process train on the same samples: the same losses and
    validation losses, rel 1e-5; validation runs at steps 2 and 4 and is printed and recorded."""
    args = ["--data-path", corpus[0], *EVAL]
    staged = run_plan(runs_dir / "data-2-stages", plan_dict([((0, 2), [1]), ((3, 5), [1])], [(2, 2)]), 2, args)
    single = run_plan(runs_dir / "data-1-process", plan_dict([((0, 5), [1])], [(4, 1)]), 1, args)
    for run in (staged, single):
        assert_ok(run)
        assert [m["step"] for m in run.metrics if "val_loss" in m] == [2, 4]
        assert "step 2/4 | validation loss" in run.log(0) and "step 4/4 | validation loss" in run.log(0)
    for mine, theirs in zip(staged.metrics, single.metrics, strict=True):
        assert ("val_loss" in mine) == ("val_loss" in theirs)
        for key in {"loss", "grad_norm", "val_loss"} & set(theirs):
            assert mine[key] == pytest.approx(theirs[key], rel=1e-5), (key, mine, theirs)
    assert staged.metrics[-1]["loss"] < staged.metrics[0]["loss"]


def test_a_long_validation_says_how_far_it_is(tmp_path, corpus):
    """A validation slower than VALIDATION_PROGRESS_S prints progress lines on rank 0 (the hook sets the
    interval to 0 s, so every batch but the last gets one); the default interval prints none here."""
    args = ["--data-path", corpus[0], "--train-iters", "2", "--eval-interval", "2", "--eval-iters", "3",
            "--split", "80,20,0", "--seed", "5", *SGD]
    plan = plan_dict([((0, 5), [1])], [(4, 1)])
    run = run_plan(tmp_path / "progress", plan, 1, args, env={"SAILOR_TEST_PROGRESS_S": "0"})
    assert_ok(run)
    lines = [line for line in run.log(0).splitlines() if line.startswith("sailor: validation after")]
    assert [line.split(" (")[0] for line in lines] == [
        "sailor: validation after step 2: 1/3 batches", "sailor: validation after step 2: 2/3 batches"], run.log(0)
    assert "step 2/2 | validation loss" in run.log(0)
    quiet = run_plan(tmp_path / "quiet", plan, 1, args)
    assert_ok(quiet)
    assert "validation after" not in quiet.log(0)
    assert quiet.metrics[-1]["val_loss"] == run.metrics[-1]["val_loss"]


@pytest.mark.slow
def test_megatron_built_blend_trains_unchanged(runs_dir, tmp_path):
    """Data written by megatron-core's IndexedDatasetBuilder itself (int32, add_item + end_document), two
    datasets blended 0.3/0.7, trains as it is."""
    rng = np.random.default_rng(2)
    a = megatron_built(tmp_path / "a", [rng.integers(0, 512, rng.integers(20, 200)) for _ in range(50)])
    b = megatron_built(tmp_path / "b", [rng.integers(0, 512, rng.integers(20, 200)) for _ in range(50)])
    run = run_plan(runs_dir / "megatron-blend", None, 1, ["--model", "tiny", "--global-batch-size", "4",
                                                          "--train-iters", "2", "--data-path", "0.3", a, "0.7", b,
                                                          "--eval-iters", "1"])
    assert_ok(run)
    assert [m["step"] for m in run.metrics] == [1, 2] and "val_loss" in run.metrics[-1]
    assert all(np.isfinite(m["loss"]) for m in run.metrics)
