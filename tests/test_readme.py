"""The README, followed to the letter: its commands run as written and do what it says.

The set-up block's `bash tools/setup.sh && ...` prefix is what CI has just run, so only the
command after it runs here (re-running the installer inside a test would reinstall the
package from the test's directory); the test-suite command is this very run and is skipped.
The tour runs in a scratch copy of the checkout (its tracked top-level entries and .venv
linked), beside a link to the shared data, so its relative paths resolve as in a checkout and
its outputs land there.
"""
import json
import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
SETUP = "bash tools/setup.sh && "


def bash_blocks(section: str) -> list[str]:
    body = README.split(f"## {section}", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.*?)```", body, flags=re.S)


def _tracked_or_installed() -> set[str]:
    """Top-level names of the checkout the tour may use: what git tracks, the venv and the installed
    package's metadata. Not what runs left in the checkout (a sailor-run.journal of another test's job
    made the tour's `sailor run` refuse to start; a plan.json would be written through its link)."""
    try:
        files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("the tour's scratch copy needs git to tell the checkout's files from a run's outputs")
    return {line.split("/", 1)[0] for line in files.splitlines()} | {".venv", "sailor.egg-info"}


@pytest.fixture
def checkout(tmp_path, sailor_data):
    if not (ROOT / ".venv" / "bin" / "activate").exists():
        pytest.skip("no .venv in the checkout: run `bash tools/setup.sh` first")
    work = tmp_path / "sailor"
    work.mkdir()
    wanted = _tracked_or_installed()
    for entry in ROOT.iterdir():
        if entry.name in wanted:
            (work / entry.name).symlink_to(entry)
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "sailor-data").symlink_to(sailor_data)
    return work


def run(script: str, cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "SAILOR_PROFILES")}
    return subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def test_setup_block_main_job(checkout):
    (block,) = bash_blocks("Set up and run")
    commands = [line for line in block.splitlines() if line.strip() and not line.startswith("#")]
    assert len(commands) == 2 and all(c.startswith(SETUP) for c in commands), "README's two set-up commands"
    main_job, tests = (c[len(SETUP):] for c in commands)
    assert tests.startswith(".venv/bin/python -m pytest") and tests.endswith(" tests")
    assert tests in (ROOT / ".ci" / "run").read_text()  # CI runs the README's test command
    out = run(main_job, checkout, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "best plan written to plan.json" in out.stdout
    assert json.loads((checkout / "plan.json").read_text())["model"] == "opt-350m"


def test_tour(checkout):
    (block,) = bash_blocks("A five-minute tour")
    out = run(block, checkout, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    for made in ("plan.json", "cheap.json", "front.png", "timeline.png", "cpu-plan.json", "train.sbatch"):
        assert (checkout / made).stat().st_size > 0, made
    assert (checkout / "cpu-profiles" / "tiny" / "CPU" / "profile.json").exists()
    assert "step 20/20" in out.stdout + out.stderr  # `sailor launch --local` trained
    # the Hugging Face model: trained from its weights, exported, loaded back by transformers
    assert "loaded Hugging Face weights from tiny-llama" in out.stderr and "step 10/10" in out.stdout + out.stderr
    assert (checkout / "llama-trained" / "model.safetensors").exists() and "LlamaForCausalLM" in out.stdout
    cheap = json.loads((checkout / "cheap.json").read_text())
    assert cheap["model"] == "opt-350m"
    assert json.loads((checkout / "zero.json").read_text())["distributed_optimizer"]
    # the elastic run: a node was lost, the survivors re-planned onto 4 ranks and finished the job
    events = [json.loads(line) for line in (checkout / "events.jsonl").read_text().splitlines()]
    kinds = [e["event"] for e in events]
    assert "node_lost" in kinds and kinds[-1] == "finished", kinds
    later = [e for e in events if e["event"] == "epoch_published" and e["epoch"] >= 2]
    assert later and later[0]["world"] == 4, later
    assert "training finished" in out.stderr
    assert "pkill" not in block and "killall" not in block  # it kills the job's own agent, by its recorded pid
    # everything the tour wrote is ignored by git: `git status` stays clean
    made = [p.name + ("/" if p.is_dir() else "") for p in checkout.iterdir() if not p.is_symlink()]
    assert made, "the tour wrote nothing?"
    ignored = subprocess.run(["git", "check-ignore", "--no-index", *made], cwd=ROOT, capture_output=True, text=True)
    assert sorted(ignored.stdout.split()) == sorted(made), f"not ignored: {set(made) - set(ignored.stdout.split())}"


def test_benchmark_commands_start(checkout):
    """The benchmarks take minutes each and print JSON (bench/); here each README command must
    at least start and answer --help."""
    (block,) = bash_blocks("Benchmarks")
    commands = [line.split("#")[0].strip() for line in block.splitlines() if line.strip()]
    assert len(commands) >= 7 and all(c.startswith("python bench/") for c in commands), commands
    for command in commands:
        out = run(f". .venv/bin/activate && {command} --help", checkout, timeout=60)
        assert out.returncode == 0 and "usage:" in out.stdout, (command, out.stderr[-1000:])
