"""A real Slurm cluster on this machine for the tests: munged, slurmctld and two slurmd, all on 127.0.0.1.

Needs Debian's slurm-wlm (CI installs it) and root (slurmd starts jobs as their users).
Node features name a GPU type and a zone each, as sailor's batch scripts ask for them.
"""
from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import time
from pathlib import Path


NODES = {"node1": "CPU,local,local-a", "node2": "CPU,local,local-b"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def available() -> str | None:
    """Why the cluster cannot run here, or None."""
    missing = [t for t in ("munged", "slurmctld", "slurmd", "sbatch", "scontrol") if not shutil.which(t)]
    if missing:
        return f"Slurm is not installed ({', '.join(missing)} missing; CI installs slurm-wlm)"
    if os.geteuid() != 0:
        return "slurmd needs root"
    return None


class Cluster:
    def __init__(self, workdir: Path):
        self.dir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.procs: list[subprocess.Popen] = []
        ctl = free_port()
        lines = [
            "ClusterName=sailortest", "SlurmctldHost=localhost(127.0.0.1)", f"SlurmctldPort={ctl}",
            "AuthType=auth/munge", f"AuthInfo=socket={workdir}/munge/munge.socket", "SlurmUser=root",
            "SlurmdUser=root", "MpiDefault=none",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "SchedulerType=sched/backfill",
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core", "ReturnToService=2",
            "JobAcctGatherType=jobacct_gather/none", "AccountingStorageType=accounting_storage/none",
            f"StateSaveLocation={workdir}/state", f"SlurmdSpoolDir={workdir}/spool-%n",
            f"SlurmctldPidFile={workdir}/slurmctld.pid", f"SlurmdPidFile={workdir}/slurmd-%n.pid",
            f"SlurmctldLogFile={workdir}/slurmctld.log", f"SlurmdLogFile={workdir}/slurmd-%n.log",
            "MinJobAge=600", "KillWait=5", "InactiveLimit=0", "SchedulerParameters=bf_interval=1",
        ]
        for name, features in NODES.items():
            lines.append(f"NodeName={name} NodeHostname=localhost NodeAddr=127.0.0.1 Port={free_port()} CPUs=2 "
                         f"Feature={features} State=UNKNOWN")
        lines.append(f"PartitionName=test Nodes={','.join(NODES)} Default=YES MaxTime=INFINITE State=UP "
                     "OverSubscribe=YES")
        (workdir / "state").mkdir(exist_ok=True)
        self.conf = workdir / "slurm.conf"
        self.conf.write_text("\n".join(lines) + "\n")
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        munge = workdir / "munge"
        munge.mkdir(exist_ok=True)
        self.socket = munge / "munge.socket"
        self._start(["munged", "-F", "--force", f"--socket={self.socket}", f"--pid-file={munge}/munged.pid",
                     f"--log-file={munge}/munged.log", f"--seed-file={munge}/seed"])
        self._wait(lambda: self.socket.exists(), "munged")
        self._start(["slurmctld", "-D", "-i", "-f", str(self.conf)])
        for name in NODES:
            self._start(["slurmd", "-D", "-N", name, "-f", str(self.conf)])
        self._wait(self._nodes_idle, "both slurmd idle")

    def _start(self, cmd: list[str]) -> None:
        log = open(self.dir / f"{Path(cmd[0]).name}-{len(self.procs)}.out", "w")
        self.procs.append(subprocess.Popen(cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT))

    def _wait(self, ready, what: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            if time.monotonic() > deadline:
                logs = "\n".join(p.read_text()[-1500:] for p in self.dir.glob("*.log"))
                raise RuntimeError(f"Slurm test cluster: {what} not ready in {timeout:g} s\n{logs}")
            time.sleep(0.5)

    def _nodes_idle(self) -> bool:
        out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], capture_output=True, text=True, env=self.env)
        states = dict(line.split() for line in out.stdout.splitlines() if line.strip())
        return len(states) == len(NODES) and all(s.startswith("idle") for s in states.values())

    def sbatch(self, script: Path, cwd: Path, env: dict | None = None) -> int:
        out = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True, cwd=cwd,
                             env={**self.env, **(env or {})})
        assert out.returncode == 0, out.stderr
        return int(out.stdout.strip().split(";")[0])

    def wait_job(self, job: int, timeout: float) -> tuple[str, str]:
        """(JobState, ExitCode) once the job (every component) has ended."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            out = subprocess.run(["scontrol", "show", "job", str(job)], capture_output=True, text=True,
                                 env=self.env).stdout
            states = re.findall(r"JobState=(\S+)", out)
            if states and all(s not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING") for s in states):
                return states[0], re.findall(r"ExitCode=(\S+)", out)[0]
            time.sleep(1)
        subprocess.run(["scancel", str(job)], env=self.env)
        raise AssertionError(f"job {job} still running after {timeout:g} s:\n{out}")

    def stop(self) -> None:
        for p in reversed(self.procs):
            p.terminate()
        for p in reversed(self.procs):
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
