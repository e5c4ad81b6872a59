"""`sailor launch --local`: the trainer's one-line error is the last thing printed, not torchrun's report."""
import sys

import planner.trainer_output as trainer_output

TORCHRUN = r'''
import sys
err = sys.stderr
print("step 1/2", flush=True)
err.write("starting rank 0\n")
{ranks}
api = "26977 torch/distributed/elastic/multiprocessing/api.py"
err.write(f"W1124 18:42:38.820000 {{api}}:1028] Sending process 1 closing signal SIGTERM\n")
err.write(f"E1124 18:42:38.856000 {{api}}:1002] failed (exitcode: 2) local_rank: 1\n")
err.write("Traceback (most recent call last):\n  File \"torch/distributed/run.py\", line 1032, in <module>\n")
err.write("torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n" + "=" * 60 + "\nRoot Cause\n")
sys.exit(1)
'''


def run(script, monkeypatch, capfd):
    monkeypatch.setattr(trainer_output, "require_module", lambda *a: None)
    code = trainer_output.run_trainer([sys.executable, "-c", script], {})
    out, err = capfd.readouterr()
    return code, out, err


def test_a_user_error_of_the_trainer_is_the_last_line(monkeypatch, capfd):
    ranks = 'err.write("sailor: error: rank 0: no weights in x\\n")\n' * 2  # every rank may say it
    code, out, err = run(TORCHRUN.format(ranks=ranks), monkeypatch, capfd)
    assert code == 2 and "step 1/2" in out
    assert err.splitlines() == ["starting rank 0", "sailor: error: rank 0: no weights in x"]


def test_a_crash_keeps_torchruns_report(monkeypatch, capfd):
    code, out, err = run(TORCHRUN.format(ranks='err.write("Segmentation fault\\n")'), monkeypatch, capfd)
    assert code == 1 and "Segmentation fault" in err and "ChildFailedError" in err and "failed (exitcode" in err


def test_success_passes_everything_through(monkeypatch, capfd):
    code, out, err = run('import sys; print("step 2/2"); sys.stderr.write("W1124 18:42:38.820000 1 '
                         'torch/distributed/run.py:1] note\\n")', monkeypatch, capfd)
    assert code == 0 and "step 2/2" in out and "note" in err
