"""What the controller, the node agents and the workers tell each other, and under which keys.

Everything goes through the controller's store (store.py). Keys:

    job/args               the training arguments (JSON list), set by the controller
    job/done               the job is over: agents and workers exit
    job/liveness           the workers' heartbeat period and stall limit (JSON), set by the controller
    node/<id>              a node's NodeInfo (JSON), set by its agent when it joins (with the URL and
                           token of its --node-dir's file server, files.py, if it has one)
    hb/<id>                the agent's heartbeat counter
    wb/<id>/<i>            worker i's heartbeat counter (its own thread; stops when the process is frozen)
    hung/<id>/<i>          the controller found worker i frozen: its agent kills it and starts a fresh one
    ready/<id>/<i>         worker i of the node has imported torch and waits for a plan
    fence/<id>             the controller gave up on the node: its agent and workers exit
    epoch                  the newest epoch (plan number)
    plan/<e>               Assignment of epoch e (JSON)
    stop/<e>               epoch e must end: "abort" (a peer is gone: leave collectives
                           now), "drain" (stop after the current step, lose nothing) or
                           "finish" (drain, save a checkpoint, end the job)
    failed/<e>/<rank>      a rank's epoch failed, and why ("fatal: ..." ends the job)
    report/<e>             rank 0's timings of epoch e's start (JSON)
    finished/<e>           rank 0 finished the last step (and its checkpoint) in epoch e
    ckpt/<e>/<step>/rank<r>  checkpoint files written (see sailor_ext/snapshot.py)
    pg/<e>/...             the process groups' own bootstrap keys
    ctl/proposal/<e>       the controller's own view of epoch e (JSON), for a controller that takes over
    log/<n>                the controller's event log, one JSON record per key

Connections introduce themselves as agent/<id> or worker/<id>/<i>, so the
controller learns of a dead process when its connection drops.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass

JOB_ARGS, JOB_DONE, EPOCH, LIVENESS = "job/args", "job/done", "epoch", "job/liveness"
ABORT, DRAIN, FINISH = "abort", "drain", "finish"
FATAL = "fatal: "  # a failed/<e>/<rank> reason that no re-plan can fix (a user mistake): the job ends


def node_key(node: str) -> str:
    return f"node/{node}"


def heartbeat_key(node: str) -> str:
    return f"hb/{node}"


def worker_beat_key(node: str, index: int) -> str:
    return f"wb/{node}/{index}"


def hung_key(node: str, index: int) -> str:
    return f"hung/{node}/{index}"


def proposal_key(epoch: int) -> str:
    return f"ctl/proposal/{epoch}"


def ready_key(node: str, index: int) -> str:
    return f"ready/{node}/{index}"


def fence_key(node: str) -> str:
    return f"fence/{node}"


def plan_key(epoch: int) -> str:
    return f"plan/{epoch}"


def stop_key(epoch: int) -> str:
    return f"stop/{epoch}"


def failed_key(epoch: int, rank: int) -> str:
    return f"failed/{epoch}/{rank}"


def report_key(epoch: int) -> str:
    return f"report/{epoch}"


def finished_key(epoch: int) -> str:
    return f"finished/{epoch}"


def agent_identity(node: str) -> str:
    return f"agent/{node}"


def worker_identity(node: str, index: int) -> str:
    return f"worker/{node}/{index}"


def parse_identity(identity: str) -> tuple[str, str, int | None]:
    """("agent"|"worker", node, worker index or None)."""
    parts = identity.split("/")
    return parts[0], parts[1], int(parts[2]) if len(parts) > 2 else None


@dataclass(frozen=True)
class NodeInfo:
    """One node (VM, machine): GPUs of one type in one zone, with one agent."""

    id: str
    gpu: str
    zone: str
    gpus: int
    host: str = "127.0.0.1"
    pid: int = 0
    files: str = ""  # URL of its --node-dir's file server (files.py), "" without one
    files_token: str = ""

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @staticmethod
    def from_json(text: bytes | str) -> "NodeInfo":
        return NodeInfo(**json.loads(text))


@dataclass(frozen=True)
class Assignment:
    """Epoch e: the plan, and which worker runs each rank."""

    epoch: int
    plan: dict  # planner.specs.plan.plan_to_dict
    ranks: tuple[tuple[str, int], ...]  # rank -> (node, worker index)
    padded_vocab: int  # fixed for the whole job, so every plan's logical tensors match
    gpus_per_node: dict[str, int]  # node size per GPU type: the rank layout depends on it
    load: str | None = None  # checkpoint directory when the workers' memory does not cover the plan
    # Workers outside the plan that join the process group only to hand over
    # their in-memory state (ranks len(ranks), len(ranks) + 1, ...).
    donors: tuple[tuple[str, int], ...] = ()

    @property
    def plan_world(self) -> int:
        return len(self.ranks)

    @property
    def world_size(self) -> int:
        return len(self.ranks) + len(self.donors)

    def worker(self, rank: int) -> tuple[str, int]:
        return (self.ranks + self.donors)[rank]

    def rank_of(self, node: str, index: int) -> int | None:
        try:
            return (self.ranks + self.donors).index((node, index))
        except ValueError:
            return None

    def node_index(self, rank: int) -> int:
        """A small integer per node, for 'same node' preferences."""
        order = list(dict.fromkeys(n for n, _ in self.ranks + self.donors))
        return order.index(self.worker(rank)[0])

    def to_json(self) -> str:
        d = asdict(self)
        d["ranks"] = [list(r) for r in self.ranks]
        d["donors"] = [list(r) for r in self.donors]
        return json.dumps(d)

    @staticmethod
    def from_json(text: bytes | str) -> "Assignment":
        d = json.loads(text)
        d["ranks"] = tuple((n, int(i)) for n, i in d["ranks"])
        d["donors"] = tuple((n, int(i)) for n, i in d.get("donors", ()))
        return Assignment(**d)
