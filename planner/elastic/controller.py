"""The sidecar controller of an elastic job: `sailor run`.

    sailor run --model tiny --global-batch 12 --gpus CPU@local=6 --gpus-per-node 2 --local \\
        -- --train-iters 100 --save ckpt --save-interval 5

It hosts the job's store (store.py) and watches the set of nodes:

  * agents join by registering (`sailor agent --store HOST:PORT ...`, or
    started here with --local); a node counts once all its workers have
    imported torch and wait for a plan;
  * a node is lost when its agent's store connection drops (a dead process
    is noticed in milliseconds), when its heartbeat stops for
    --heartbeat-misses beats (a frozen or partitioned node), or when a
    provider hook (--nodes-file / --nodes-command: the VMs the cloud says
    exist) no longer lists it; lost nodes are fenced, so they can never
    rejoin under the old plan (no split brain);
  * a rank whose collective failed reports it.

On a change it re-plans with the planner for the nodes present
(replan.py), ends the running epoch (stop/<e>: "abort" when a node is gone,
so the survivors leave their collectives at once; "drain" when nodes join
or are announced to leave, so every rank stops after the same step and
nothing is lost) and publishes the next epoch's plan (plan/<e+1>). The
workers, still alive, re-form their process groups and reshard their state
in place (sailor_ext/elastic/worker.py). A node that joins is folded in when
the planner's plan with it saves more time over the remaining steps than a
reconfiguration costs.

Every decision goes to --events-file as one JSON line (time, event, details).

The controller may die: every write to the store is also made durable
(--state: a journal file, or etcd; state.py), the workers train on without
it, and a controller started again with the same --state re-adopts the
running job (adopt). Only one leads a job at a time. Torch-free.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import queue
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from planner import flags
from planner.elastic import protocol as P
from planner.elastic.provider import Answer, ProviderWatch, check_provider, describe
from planner.elastic.replan import Proposal, Replanner, pays_off
from planner.elastic.store import StoreServer
from planner.errors import SailorError
from planner.launch import DISTRIBUTED_OPTIMIZER
from planner.outputs import append_record

REMOVED = "removed by the provider"  # why a drained node is lost
SHOWN_IDS = 10  # node ids a message or an event names; the rest are counted
FORBIDDEN_TRAIN_ARGS = ("--plan", "--global-batch-size", "--micro-batch-size", "--tensor-model-parallel-size",
                        "--pipeline-model-parallel-size")


@dataclass
class NodeState:
    info: P.NodeInfo
    joined: float  # monotonic
    beat: bytes = b""
    beat_at: float = 0.0
    ready: bool = False
    lost: str | None = None  # why the node is gone
    leaving: bool = False  # the provider no longer lists it: drain it out
    workers: dict = field(default_factory=dict)  # worker index -> (pid, last beat, when it changed)


@dataclass
class Epoch:
    number: int
    proposal: Proposal
    published: float  # wall clock
    reason: str
    stopping: str | None = None  # ABORT or DRAIN once stop/<e> is set
    failures: dict = field(default_factory=dict)  # rank -> reason
    first_failure: float = 0.0  # monotonic
    reported: bool = False
    progress: int = 0


class EventLog:
    """One JSON line per decision, and a human line on stderr; also kept in the job's durable
    state (log/<n>), so a controller that takes over continues it."""

    def __init__(self, path: str | None, quiet: bool = False):
        self.path, self.file = path, open(path, "a") if path else None
        self.quiet = quiet
        self.keep = None  # (key, value) -> None: the store, once it serves
        self.count = 0

    def emit(self, event: str, message: str = "", **fields) -> None:
        record = {"t": time.time(), "event": event, **fields}
        if self.file:
            append_record(self.file, record, f"--events-file {self.path}", "free space or give another file")
        if self.keep is not None:
            self.count += 1
            self.keep(f"log/{self.count:08d}", json.dumps(record))
        if message and not self.quiet:
            print(f"sailor run: {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Settings:
    train_args: list[str]
    train_iters: int
    heartbeat_s: float = 0.5
    heartbeat_misses: int = 4
    settle_s: float = 0.01  # batch changes this close together into one re-plan
    reconfigure_cost_s: float | None = None  # None: the last measured reconfiguration (2 s before any)
    min_gpus: int = 0  # wait for this many GPUs before the first plan
    wait_s: float = 300.0  # how long to wait for nodes before giving up
    provider_file: str | None = None
    provider_command: str | None = None
    provider_interval_s: float = 2.0
    max_failures: int = 20  # epochs ended by failures without any node change
    worker_stall_s: float = 30.0  # a worker whose training makes no progress this long reports it
    padded_vocab: int = 0
    load: str | None = None
    poll_s: float = 0.01


class Controller:
    def __init__(self, settings: Settings, replanner: Replanner, events: EventLog, host: str = "127.0.0.1",
                 port: int = 0, state=None, loaded: dict[bytes, bytes] | None = None):
        self.s, self.replanner, self.events = settings, replanner, events
        self.state = state  # state.Journal / etcd.EtcdState: where every write of the store also goes
        self.disconnects: queue.Queue = queue.Queue()
        self.server = StoreServer(host, port, on_disconnect=lambda who: self.disconnects.put((who, time.time())),
                                  durable=state, data=loaded)
        self.events.keep = self.server.set
        self.events.count = len(self.server.keys("log/"))
        self.grace_until = 0.0  # monotonic: after taking over a job, give agents and workers time to reconnect
        self.nodes: dict[str, NodeState] = {}
        self.epoch: Epoch | None = None
        self.next_epoch = 1
        self.failure_epochs = 0
        self.last_change = time.monotonic()
        self.evaluated_at = -1.0  # membership time the join policy last looked at
        self.measured_reconfigure_s: float | None = None
        self.provider = ProviderWatch(settings.provider_file, settings.provider_command,
                                      settings.provider_interval_s) \
            if settings.provider_file or settings.provider_command else None  # asked once run() starts
        self.provider_listed: frozenset[str] | None = None
        self.provider_failing = False  # the hook's last poll could not be read
        self.provider_missed: set[str] = set()  # live nodes the last poll of the provider did not list
        self.local_agents: list[subprocess.Popen] = []
        self.waiting_logged = False
        self.finish_requested = 0.0  # monotonic time of a stop request (SIGTERM/SIGINT), 0 if none

    @property
    def address(self) -> tuple[str, int]:
        return self.server.address

    # -- membership ------------------------------------------------------------------
    def _changed(self) -> None:
        self.last_change = time.monotonic()

    def _lose(self, node: NodeState, cause: str, detected: float) -> None:
        if node.lost:
            return
        node.lost = cause
        self.server.set(P.fence_key(node.info.id), cause)
        self._changed()
        self.events.emit("node_lost", f"node {node.info.id} lost ({cause})", node=node.info.id, cause=cause,
                         t_detect=detected)

    def _scan(self) -> None:
        now = time.monotonic()
        while True:
            try:
                who, at = self.disconnects.get_nowait()
            except queue.Empty:
                break
            kind, node_id, index = P.parse_identity(who)
            node = self.nodes.get(node_id)
            if node is None or node.lost or self.server.get(P.JOB_DONE) is not None:
                continue
            if kind == "agent":
                self._lose(node, "agent disconnected", at)
            elif kind == "worker":
                # a worker died on a live node: its agent starts a fresh one; until then the node is not ready
                self.server.delete(P.ready_key(node_id, index))
                if node.ready:
                    node.ready = False
                    self._changed()
                    self.events.emit("worker_lost", f"worker {node_id}/{index} exited; its agent restarts it",
                                     node=node_id, index=index, t_detect=at)
        for key in self.server.keys("node/"):
            node_id = key.split("/", 1)[1]
            if node_id not in self.nodes:
                info = P.NodeInfo.from_json(self.server.get(key))
                self.nodes[node_id] = NodeState(info, now, beat_at=now)
                self.events.emit("node_joined", f"node {node_id} joined: {info.gpus} x {info.gpu} in {info.zone}",
                                 node=node_id, gpus=info.gpus, gpu=info.gpu, zone=info.zone, pid=info.pid)
        ttl = self.s.heartbeat_s * self.s.heartbeat_misses
        patient = now < self.grace_until
        for node in self.nodes.values():
            if node.lost:
                continue
            beat = self.server.get(P.heartbeat_key(node.info.id)) or b""
            if beat != node.beat or patient:
                node.beat, node.beat_at = beat, now
            elif now - node.beat_at > ttl:
                self._lose(node, f"no heartbeat for {now - node.beat_at:.1f} s", time.time())
                continue
            self._watch_workers(node, now, ttl, patient)
            if not node.ready and all(self.server.get(P.ready_key(node.info.id, i)) is not None
                                      for i in range(node.info.gpus)):
                node.ready = True
                self._changed()
                self.events.emit("node_ready", f"node {node.info.id}: {node.info.gpus} worker(s) ready",
                                 node=node.info.id)
        self._poll_provider()

    def _watch_workers(self, node: NodeState, now: float, ttl: float, patient: bool) -> None:
        """A worker whose own heartbeat stops (a frozen process: SIGSTOP, a stuck VM page, a debugger)
        while its agent lives is hung: its agent restarts it, and the plan goes on without its node."""
        for i in range(node.info.gpus):
            pid = self.server.get(P.ready_key(node.info.id, i))
            if pid is None:
                node.workers.pop(i, None)
                continue
            beat = self.server.get(P.worker_beat_key(node.info.id, i)) or b""
            seen = node.workers.get(i)
            if seen is None or seen[:2] != (pid, beat) or patient:
                node.workers[i] = (pid, beat, now)
            elif now - seen[2] > ttl:
                del node.workers[i]
                self.server.delete(P.ready_key(node.info.id, i))
                self.server.set(P.hung_key(node.info.id, i), f"no heartbeat for {now - seen[2]:.1f} s")
                if node.ready:
                    node.ready = False
                    self._changed()
                self.events.emit("worker_hung", f"worker {node.info.id}/{i} (pid {pid.decode()}) sent no heartbeat "
                                 f"for {now - seen[2]:.1f} s; its agent restarts it", node=node.info.id, index=i,
                                 pid=int(pid), t_detect=time.time())

    def _poll_provider(self) -> None:
        answer = self.provider.take() if self.provider is not None else None
        if answer is not None:
            self._apply_provider(answer)

    def _apply_provider(self, answer: Answer) -> None:
        """One poll of the provider hook: drain the nodes it stopped listing."""
        hook = describe(self.s.provider_file, self.s.provider_command)
        if answer.ids is None:  # the last list stands; said once per spell of failures
            if not self.provider_failing:
                self.provider_failing = True
                self.events.emit("provider_error", f"{hook} cannot be read ({answer.why}); its last list stands "
                                 "until it can", reason=answer.why)
            return
        listed = answer.ids
        if listed != self.provider_listed or self.provider_failing:
            missing = sorted(listed - set(self.nodes))
            shown = ", ".join(missing[:SHOWN_IDS]) + (f" and {len(missing) - SHOWN_IDS} more"
                                                       if len(missing) > SHOWN_IDS else "")
            self.events.emit("provider", f"provider lists {len(listed)} node(s)"
                             + (f"; not joined yet: {shown}" if missing else ""),
                             **({"listed": sorted(listed)} if len(listed) <= SHOWN_IDS else {"count": len(listed)}))
            self.provider_listed, self.provider_failing = listed, False
        # a node is drained once two polls in a row miss it: one miss may be the hook's hiccup (a list read
        # while being rewritten, a cloud API answering with a partial page), and a drain cannot be undone
        missed = {node.info.id for node in self.nodes.values()
                  if not node.lost and not node.leaving and node.info.id not in listed}
        for node_id in sorted(missed & self.provider_missed):
            node = self.nodes[node_id]
            node.leaving = True
            self._changed()
            self.events.emit("node_leaving", f"node {node_id} is no longer listed by the provider ({hook}); "
                             "draining it out", node=node_id)
        self.provider_missed = missed

    def usable(self) -> list[P.NodeInfo]:
        nodes = [n for n in self.nodes.values() if n.ready and not n.lost and not n.leaving]
        return [n.info for n in sorted(nodes, key=lambda n: n.joined)]

    # -- epochs ----------------------------------------------------------------------
    def _stop(self, how: str, why: str) -> None:
        e = self.epoch
        if e is None or e.stopping:
            return
        e.stopping = how
        self.server.set(P.stop_key(e.number), how)
        self.events.emit("epoch_stop", f"ending epoch {e.number} ({how}): {why}", epoch=e.number, how=how,
                         reason=why)

    def _publish(self, proposal: Proposal, reason: str) -> None:
        number = self.next_epoch
        self.next_epoch += 1
        from planner.specs.plan import plan_to_dict

        # every other worker joins as a donor of its in-memory state (leaving nodes too: not fenced yet)
        used = set(proposal.ranks)
        donors = tuple((n.info.id, i) for n in sorted(self.nodes.values(), key=lambda n: n.joined)
                       if n.ready and not n.lost for i in range(n.info.gpus) if (n.info.id, i) not in used)
        assignment = P.Assignment(number, plan_to_dict(proposal.plan), proposal.ranks, self.s.padded_vocab,
                                  proposal.gpus_per_node, self.s.load, donors)
        published = time.time()
        self.server.set(P.proposal_key(number), json.dumps({
            "iteration_time_s": proposal.iteration_time_s, "planning_s": proposal.planning_s, "reason": reason,
            "published": published}))
        self.server.set(P.plan_key(number), assignment.to_json())
        self.server.set(P.EPOCH, str(number))
        self.epoch = Epoch(number, proposal, published, reason)
        self.events.emit("epoch_published", f"epoch {number}: {proposal.describe()} ({reason}; planned in "
                         f"{proposal.planning_s * 1e3:.0f} ms, {proposal.iteration_time_s:.3g} s/step predicted)"
                         + (f"; {len(donors)} other worker(s) hand over their state" if donors else ""),
                         epoch=number, reason=reason, nodes=list(proposal.nodes), world=len(proposal.ranks),
                         donors=len(donors),
                         planning_s=proposal.planning_s, predicted_step_s=proposal.iteration_time_s)

    def _poll_epoch(self) -> bool:
        """Reports of the running epoch; True when the job is finished."""
        e = self.epoch
        if e is None:
            return False
        if self.server.get(P.finished_key(e.number)) is not None:
            return True
        if not e.reported and (raw := self.server.get(P.report_key(e.number))) is not None:
            e.reported = True
            report = json.loads(raw)
            total = report["t_first_step"] - e.published
            self.events.emit("epoch_started", f"epoch {e.number} running: state from {report['source']} at step "
                             f"{report['step']}, first step done {total:.2f} s after the plan was published",
                             **report, t_published=e.published)
            if e.reason != "start":
                self.measured_reconfigure_s = report["t_first_step"] - report["t_start"]
            self.failure_epochs = 0  # it made progress
            for node in self.nodes.values():  # nodes drained out are fenced once the next plan runs
                if node.leaving and not node.lost:
                    self._lose(node, REMOVED, time.time())
        if (raw := self.server.get(f"progress/{e.number}")) is not None:
            e.progress = int(raw)
        for key in self.server.keys(f"failed/{e.number}/"):
            rank = int(key.rsplit("/", 1)[1])
            if rank not in e.failures:
                e.failures[rank] = self.server.get(key).decode()
                if e.failures[rank].startswith(P.FATAL):
                    raise SailorError(f"rank {rank}: {e.failures[rank][len(P.FATAL):]}")
                e.first_failure = e.first_failure or time.monotonic()
                self.events.emit("rank_failed", f"epoch {e.number} rank {rank}: {e.failures[rank][:200]}",
                                 epoch=e.number, rank=rank, reason=e.failures[rank])
        return False

    def _decide(self) -> None:
        now = time.monotonic()
        e = self.epoch
        if self.finish_requested:
            if e is None:
                raise KeyboardInterrupt
            if not e.stopping:
                self._stop(P.FINISH, "stop requested: finishing the current step and saving")
                return
            if e.stopping == P.FINISH:
                if e.failures or any(self.nodes[n].lost for n in e.proposal.nodes) or \
                        now - self.finish_requested > 120:
                    raise SailorError("stopped before a final checkpoint could be written; resume from the last "
                                      "one with --load SAVE_DIR")
                return
            # a reconfiguration is under way: let it publish, then finish that epoch
        if e is not None and not e.stopping:
            gone = [n for n in e.proposal.nodes if self.nodes[n].lost]
            unready = [n for n in e.proposal.nodes if not self.nodes[n].ready and not self.nodes[n].lost]
            leaving = [n for n in e.proposal.nodes if self.nodes[n].leaving]
            if gone or unready:
                self._stop(P.ABORT, f"lost {', '.join(gone + unready)}")
            elif e.failures and now - e.first_failure >= self.s.settle_s:
                self.failure_epochs += 1
                if self.failure_epochs > self.s.max_failures:
                    raise SailorError(f"{self.failure_epochs} epochs in a row failed without any node change (last: "
                                      f"{next(iter(e.failures.values()))[:200]}); see the workers' logs")
                self._stop(P.ABORT, f"rank(s) {sorted(e.failures)} failed")
            elif leaving:
                self._stop(P.DRAIN, f"{', '.join(leaving)} leaving")
            elif self.last_change > self.evaluated_at:
                self.evaluated_at = self.last_change
                self._consider_joins()
            return
        # no running epoch: plan for the nodes present
        nodes = self.usable()
        if self.epoch is None and sum(n.gpus for n in nodes) < self.s.min_gpus:
            return
        if e is not None and now - self.last_change < self.s.settle_s:
            return
        proposal = self.replanner.propose(nodes) if nodes else None
        if proposal is None:
            if not self.waiting_logged:
                self.waiting_logged = True
                self.events.emit("waiting", f"no plan fits the {len(nodes)} node(s) present; waiting for nodes",
                                 nodes=[n.id for n in nodes])
            return
        self.waiting_logged = False
        reason = "start" if e is None else ("recover" if e.stopping == P.ABORT else "replan")
        self._publish(proposal, reason)
        self.evaluated_at = self.last_change

    def _consider_joins(self) -> None:
        e = self.epoch
        nodes = self.usable()
        if set(n.id for n in nodes) <= set(e.proposal.nodes):
            return
        proposal = self.replanner.propose(nodes)
        if proposal is None or set(proposal.nodes) == set(e.proposal.nodes):
            return
        cost = self.s.reconfigure_cost_s
        if cost is None:
            cost = self.measured_reconfigure_s if self.measured_reconfigure_s is not None else 2.0
        remaining = self.s.train_iters - e.progress
        if not pays_off(e.proposal.iteration_time_s, proposal.iteration_time_s, remaining, cost):
            self.events.emit("join_deferred", f"a plan with the new node(s) would take "
                             f"{proposal.iteration_time_s:.3g} s/step vs {e.proposal.iteration_time_s:.3g}: not "
                             f"worth a {cost:.1f} s reconfiguration over {remaining} steps",
                             proposed_step_s=proposal.iteration_time_s, current_step_s=e.proposal.iteration_time_s,
                             remaining=remaining, cost_s=cost)
            return
        self._stop(P.DRAIN, f"node(s) {', '.join(sorted(set(proposal.nodes) - set(e.proposal.nodes)))} pay off")
        self._publish(proposal, "scale")

    # -- taking over ----------------------------------------------------------------------
    def adopt(self) -> bool:
        """Rebuild the controller's view from the store as the last controller left it (loaded from the
        job's durable state); True if there was a job to take over. The running epoch is kept, its
        workers go on as they were: nothing restarts."""
        from planner.specs.plan import plan_from_dict

        node_keys = self.server.keys("node/")
        if not node_keys and self.server.get(P.EPOCH) is None:
            return False
        now = time.monotonic()
        self.grace_until = now + max(5.0, 2 * self.s.heartbeat_s * self.s.heartbeat_misses)
        for order, key in enumerate(node_keys):  # in the order the nodes first joined
            info = P.NodeInfo.from_json(self.server.get(key))
            node = NodeState(info, now + order * 1e-6, beat_at=now)
            node.lost = (self.server.get(P.fence_key(info.id)) or b"").decode() or None
            node.ready = all(self.server.get(P.ready_key(info.id, i)) is not None for i in range(info.gpus))
            self.nodes[info.id] = node
        plans = [int(k.split("/")[1]) for k in self.server.keys("plan/")]
        if plans:
            number = max(plans)
            a = P.Assignment.from_json(self.server.get(P.plan_key(number)))
            view = json.loads(self.server.get(P.proposal_key(number)) or b"{}")
            proposal = Proposal(plan_from_dict(a.plan), view.get("iteration_time_s", 0.0), a.ranks,
                                a.gpus_per_node, view.get("planning_s", 0.0))
            stop = self.server.get(P.stop_key(number))
            self.epoch = Epoch(number, proposal, view.get("published", time.time()), view.get("reason", "start"),
                               stopping=stop.decode() if stop else None,
                               reported=self.server.get(P.report_key(number)) is not None)
            self.next_epoch = number + 1
            if self.server.get(P.EPOCH) != str(number).encode():
                self.server.set(P.EPOCH, str(number))
        self.evaluated_at = self.last_change
        e = self.epoch
        self.events.emit("controller_adopted", f"took over the running job: {len(self.nodes)} node(s)"
                         + (f", epoch {e.number}" + (f" ({e.stopping})" if e.stopping else "") if e else ""),
                         nodes=sorted(self.nodes), epoch=e.number if e else None)
        return True

    # -- the loop ---------------------------------------------------------------------
    def request_finish(self, signum=None, frame=None) -> None:
        """First SIGTERM/SIGINT: finish the step, save, end the job. Second: stop now."""
        if self.finish_requested:
            raise KeyboardInterrupt
        self.finish_requested = time.monotonic()

    def run(self) -> int:
        deadline = time.monotonic() + self.s.wait_s
        if self.provider is not None:
            self.provider.start()
        try:
            while True:
                if getattr(self.state, "lost", None):
                    raise SailorError(f"this controller no longer leads the job ({self.state.lost}); another one "
                                      "took over or must: start `sailor run` again with the same --state")
                self._scan()
                if self._poll_epoch():
                    return self._finish()
                self._decide()
                if self.epoch is not None and not self.epoch.stopping:
                    deadline = time.monotonic() + self.s.wait_s
                elif time.monotonic() > deadline:
                    raise SailorError(f"no plan could run for {self.s.wait_s:g} s ({self._presence()}); add nodes "
                                      "and resume with --load SAVE_DIR")
                time.sleep(self.s.poll_s)
        except SailorError:
            if not getattr(self.state, "lost", None):  # the job ends: the agents stop their workers once they read it
                self.server.set(P.JOB_DONE, "1")
                self._await_agents(10.0)
            raise
        finally:
            if self.provider is not None:
                self.provider.close()
            if not getattr(self.state, "lost", None):
                self.server.set(P.JOB_DONE, "1")
            self._stop_local_agents()

    def _presence(self) -> str:
        """The nodes present, and those that joined but whose workers never became ready (a slow or
        overloaded machine, workers that fail to start): "none" alone would hide them."""
        ready = [n.id for n in self.usable()]
        unready = [n.info.id for n in self.nodes.values() if not n.lost and not n.ready and not n.leaving]
        drained = [n.info.id for n in self.nodes.values() if n.leaving or n.lost == REMOVED]
        hook = describe(self.s.provider_file, self.s.provider_command)
        return f"nodes present: {', '.join(ready) or 'none'}" + "".join(
            f"; {what}: {', '.join(ids[:SHOWN_IDS])}" + (f" and {len(ids) - SHOWN_IDS} more"
                                                         if len(ids) > SHOWN_IDS else "")
            for what, ids in (("joined but their workers not ready", unready),
                              (f"drained, as {hook} does not list them", drained)) if ids)

    def _finish(self) -> int:
        e = self.epoch
        self.server.set(P.JOB_DONE, "1")
        self.events.emit("finished", f"training finished in epoch {e.number} at step "
                         f"{self.server.get(P.finished_key(e.number)).decode()}", epoch=e.number)
        self._await_agents(30.0)
        return 0

    def _await_agents(self, limit_s: float) -> None:
        """Keep the store up until every agent has read job/done and left, for at most `limit_s`: an agent
        that finds no store reconnects, with its workers, for as long as --controller-wait-s allows."""
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            while not self.disconnects.empty():
                who, _ = self.disconnects.get_nowait()
                kind, node_id, _ = P.parse_identity(who)
                if kind == "agent" and node_id in self.nodes:
                    self.nodes[node_id].lost = self.nodes[node_id].lost or "left at the end of the job"
            if all(n.lost for n in self.nodes.values()) and all(a.poll() is not None for a in self.local_agents):
                break
            time.sleep(0.05)

    def start_local_agents(self, nodes: list[tuple[str, str, int]], heartbeat_s: float, cluster: str | None,
                           store: str, node_dirs: str | None = None) -> None:
        for i, (gpu, zone, count) in enumerate(nodes):
            cmd = [sys.executable, "-m", "planner.elastic.agent", "--store", store, "--gpus",
                   f"{gpu}@{zone}={count}", "--node-id", f"node{i}", "--heartbeat-s", str(heartbeat_s),
                   "--controller-wait-s", str(self.s.wait_s)]
            if cluster:
                cmd += ["--cluster", cluster]
            if node_dirs:  # each its own "disk", as separate machines would have
                cmd += ["--node-dir", os.path.join(node_dirs, f"node{i}"), "--host", "127.0.0.1"]
            # in their own session: they outlive a controller that dies, and the next one takes them over
            self.local_agents.append(subprocess.Popen(cmd, start_new_session=True))

    def _stop_local_agents(self) -> None:
        for a in self.local_agents:
            if a.poll() is None:
                a.terminate()
        for a in self.local_agents:
            try:
                a.wait(timeout=10)
            except subprocess.TimeoutExpired:
                a.kill()


# -- the command ------------------------------------------------------------------------
def add_parser(subparsers, add_common=None) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "run", help="train elastically: re-plan and reconfigure in place when nodes come and go",
        description="Start the controller of an elastic job (it hosts the job's store), optionally with local "
                    "node agents; arguments after '--' go to the training workers (sailor_ext.train's).")
    p.add_argument("--model", required=True, type=flags.nonempty("a model"),
                   help="model preset or config.json (the plans carry it to the workers)")
    p.add_argument("--seq-length", type=flags.seq_length, metavar="TOKENS",
                   help="training sequence length (default: a preset's own; a config.json's min(2048, its context "
                        "length))")
    p.add_argument("--global-batch", type=flags.batch, required=True, metavar="SAMPLES",
                   help="samples per step, fixed for the whole job")
    p.add_argument("--gpus", metavar="TYPE@ZONE=N,...",
                   help="with --local: the GPUs to start agents for; else: wait for this many before the first plan")
    p.add_argument("--gpus-per-node", type=flags.integer(1, 1024), metavar="N",
                   help="with --local: GPUs per agent (default: the type's node size)")
    p.add_argument("--local", action="store_true", help="start the node agents on this machine")
    p.add_argument("--node-dirs", metavar="DIR",
                   help="with --local: agent i's --node-dir is DIR/node<i> (checkpoints saved to node:NAME)")
    p.add_argument("--objective", default="throughput", choices=["throughput", "cost", "cost-per-token"],
                   help="what each plan of the job optimizes (default throughput)")
    p.add_argument("--host", default="127.0.0.1", help="address to serve the job's store on (default 127.0.0.1)")
    p.add_argument("--port", type=flags.port, default=0, help="port of the job's store (default: any free port)")
    p.add_argument("--address-file", type=flags.nonempty("a file"),
                   help="write HOST:PORT of the store here once it serves")
    p.add_argument("--events-file", type=flags.nonempty("a file"),
                   help="append one JSON line per event (joins, losses, plans, timings)")
    p.add_argument("--heartbeat-s", type=flags.number(above=0.0, hi=3600.0), default=0.5, metavar="SECONDS",
                   help="agents' heartbeat period (default 0.5)")
    p.add_argument("--heartbeat-misses", type=flags.integer(1, 10**6), default=4, metavar="N",
                   help="a node whose heartbeat stops this many periods is lost (default 4)")
    p.add_argument("--reconfigure-cost-s", type=flags.number(0.0, 1e9), metavar="SECONDS",
                   help="what a reconfiguration costs when deciding whether a joining node pays off (default: the "
                        "last one measured, 2 s before any)")
    p.add_argument("--nodes-file", type=flags.nonempty("a file"),
                   help="provider hook: a file listing the node ids that exist (one per line)")
    p.add_argument("--nodes-command", type=flags.nonempty("a command"),
                   help="provider hook: a command that prints the node ids that exist")
    p.add_argument("--nodes-interval-s", type=flags.number(above=0.0, hi=1e6), default=2.0, metavar="SECONDS",
                   help="how often to ask the provider hook (default 2 s); a node two polls in a row miss is drained")
    p.add_argument("--max-tp", type=flags.integer(1, 64), default=8, metavar="TP",
                   help="largest TP degree any plan of the job may use; the vocabulary is padded for it (default 8)")
    p.add_argument("--wait-s", type=flags.seconds, default=300.0, metavar="SECONDS",
                   help="give up after this long without a runnable plan (default 300)")
    p.add_argument("--load", help="resume from this checkpoint directory (when the workers have no state in memory)")
    p.add_argument("--state", default="sailor-run.journal", metavar="FILE|etcd://HOST:PORT/JOB",
                   help="the job's durable state: a controller started again with it takes over the running job "
                        "(default: the journal file sailor-run.journal here; etcd: from any machine)")
    p.add_argument("--worker-stall-s", type=flags.number(above=0.0, hi=1e6), default=30.0, metavar="SECONDS",
                   help="a worker whose training makes no progress this long (and 10 slowest steps) ends the epoch "
                        "(default 30; a frozen worker is found by its heartbeat, within --heartbeat-s x "
                        "--heartbeat-misses)")
    p.add_argument("rest", nargs=argparse.REMAINDER, metavar="-- TRAIN_ARGS",
                   help="arguments for the workers (sailor_ext.train's), after '--'")
    if add_common:
        add_common(p)
    p.set_defaults(func=run)
    return p


def _train_args(args, model) -> tuple[list[str], int, int]:
    """The workers' arguments, checked here so a mistake is one line, not N crashed workers.

    The model and its sequence length reach the workers in every plan (plan/<e>), so they need no
    --model: a config.json need not exist on their nodes."""
    rest = list(args.rest or [])
    if rest and rest[0] == "--":
        rest = rest[1:]
    elif rest:
        raise SailorError(f"sailor run: unknown option {rest[0]!r}; put training arguments after '--' (see "
                          "`sailor run --help`)")
    for flag in FORBIDDEN_TRAIN_ARGS:
        if any(a == flag or a.startswith(flag + "=") for a in rest):
            raise SailorError(f"{flag} is decided by the planner in `sailor run`; drop it (use --global-batch for "
                              "the batch)")
    if not any(a == "--train-iters" or a.startswith("--train-iters=") for a in rest):
        raise SailorError("sailor run needs the number of training steps: add -- --train-iters N at the end (training "
                          "arguments go after '--')")
    from sailor_ext.train import check_model_flags, check_save_dir, check_train_args  # torch-free: parsing only

    parsed = check_train_args(rest)
    check_model_flags(parsed, model)
    rest = _with_precision(getattr(args, "precision", None), parsed, rest)
    if parsed.model is not None and parsed.model != args.model:
        raise SailorError(f"training argument --model {parsed.model} contradicts sailor run --model {args.model}")
    if parsed.seq_length is not None and parsed.seq_length != model.seq_len:
        raise SailorError(f"training argument --seq-length {parsed.seq_length} contradicts the job's sequence length "
                          f"{model.seq_len}; give it to sailor run as --seq-length")
    if parsed.save and parsed.save.startswith("node:"):
        name = parsed.save[len("node:"):].strip("/")
        if not name or ".." in name.split("/"):
            raise SailorError(f"--save {parsed.save}: give node:NAME, a directory name below each node's --node-dir")
        if args.local and not args.node_dirs:
            raise SailorError(f"--save {parsed.save} keeps checkpoints on the nodes' own disks: with --local, give "
                              "--node-dirs DIR (agent i keeps its files in DIR/node<i>)")
    if parsed.load and parsed.load != args.load:  # the workers resume from sailor run's --load only
        raise SailorError(f"--load {parsed.load} after '--' would be ignored: give it to sailor run itself, before "
                          "'--' (sailor run --load DIR ... -- ...)")
    check_save_dir(parsed)  # a --save under a file failed every checkpoint of the job, after training
    if args.load and "--load" not in rest:
        rest += ["--load", args.load]
    return rest, parsed.train_iters, parsed.make_vocab_size_divisible_by


def _with_precision(precision: str | None, parsed, rest: list[str]) -> list[str]:
    """The workers' arguments with the job's --precision flag in front (as `sailor launch` adds a plan's):
    the planner sizes every plan for that precision, so the workers must train in it."""
    from planner.specs.precision import RUNTIME_FLAGS

    asked = "fp16" if parsed.fp16 else {True: "bf16", False: "fp32", None: None}[parsed.bf16]
    if precision is None or asked == precision:
        return rest
    if asked is not None:
        raise SailorError(f"--precision {precision} contradicts the training argument {RUNTIME_FLAGS[asked]} after "
                          "'--'; drop one of them")
    return [RUNTIME_FLAGS[precision], *rest]


def job_vocabulary(vocab: int, divisor: int, max_tp: int, load: str | None) -> tuple[int, int]:
    """(padded vocabulary, largest TP degree) for every plan of the job.

    The padding must not change between plans, or the logical embedding
    would change shape; so it is fixed for the largest TP degree allowed. A
    job that resumes a checkpoint keeps that checkpoint's padding and allows
    only the TP degrees it divides into."""
    step = divisor * max_tp
    padded = math.ceil(vocab / step) * step
    if not load:
        return padded, max_tp
    import fsspec  # a local directory or an object store's URL (s3://...)

    fs, root = fsspec.core.url_to_fs(load)
    latest = f"{root}/latest"
    if not fs.exists(latest) and not fs.exists(f"{root}/meta.json"):
        raise SailorError(f"no checkpoint in {load} (no 'latest' file); give the --save directory of a previous run")
    saved = _saved_padding(fs, root) if fs.exists(latest) else _read_padding(fs, f"{root}/meta.json")
    if not saved:
        return padded, max_tp  # the workers check the checkpoint and say what is wrong with it
    tp = max_tp
    while tp > 1 and saved % (divisor * tp):
        tp //= 2
    return saved, tp


def _read_padding(fs, path: str) -> int | None:
    """padded_vocab of a checkpoint's meta.json ({"sha256": ..., "meta": {...}}), None if it does not read."""
    try:
        meta = json.loads(fs.cat_file(path))
        saved = meta.get("meta", meta).get("padded_vocab")
    except (OSError, ValueError, AttributeError):
        return None
    return saved if isinstance(saved, int) and saved > 0 else None


def _saved_padding(fs, root: str) -> int | None:
    """The padding of the checkpoint the workers resume: the one `latest` names, else (a damaged `latest`,
    from which sailor_ext.checkpoint.choose falls back) the newest iter_NNNNNNN whose meta.json reads.
    Torch-free, so not through sailor_ext.checkpoint."""
    import re

    try:
        names = sorted((p.rstrip("/").rpartition("/")[2] for p in fs.ls(root, detail=False)), reverse=True)
    except OSError:
        names = []
    try:
        first = fs.cat_file(f"{root}/latest").decode().split()[:1]  # "iter_NNNNNNN SHA256"
    except (OSError, ValueError):  # a directory, unreadable, not text
        first = []
    iters = [n for n in first + names if re.fullmatch(r"iter_\d{7}", n)]
    return next(filter(None, (_read_padding(fs, f"{root}/{n}/meta.json") for n in iters)), None)


def run(args) -> int:
    from planner.outputs import check_output, write_output
    from planner.profiles.store import load_profiles
    from planner.search.goal import Goal
    from planner.specs.hardware import load_cluster, parse_gpus
    from planner.specs.model import get_model, seq_length_reason

    # Every flag is checked before the store or an agent starts: a mistake is one line, not a job
    # that waits out --wait-s.
    model = get_model(args.model, args.seq_length)
    train_args, train_iters, divisor = _train_args(args, model)
    cluster = load_cluster(args.cluster)
    if args.max_tp & (args.max_tp - 1):
        raise SailorError(f"--max-tp {args.max_tp} must be a power of two (1, 2, 4, 8...)")
    if args.load and args.load.startswith("node:"):
        raise SailorError(f"--load {args.load}: checkpoints on the nodes' own disks are resumed from --save: give "
                          f"`-- --save {args.load}` to the job, and start the agents with the same --node-dir")
    if args.load and "://" not in args.load and not Path(args.load).is_dir():
        raise SailorError(f"no checkpoint in {args.load}: it is not a directory; give --load the --save directory of "
                          "a previous run")
    from sailor_ext.train import check_train_args, input_paths  # torch-free: argument parsing only

    parsed = check_train_args(train_args)
    reads = (args.cluster, args.load, args.nodes_file, *input_paths(parsed),
             args.model if Path(args.model).is_file() else None)  # (what the job and its workers read or write)
    for flag, path in (("--events-file", args.events_file), ("--address-file", args.address_file)):
        if path:  # (events are appended: /dev/stdout will do)
            check_output(path, reads, flag, replaced=flag == "--address-file")
    if args.events_file and args.address_file and Path(args.events_file).resolve() == \
            Path(args.address_file).resolve():
        raise SailorError("--events-file and --address-file name the same file; give each its own")
    if args.nodes_file and args.nodes_command:
        raise SailorError("give the provider hook as --nodes-file or as --nodes-command, not both")
    if not args.state.startswith("etcd://"):  # the journal is rewritten at start: never over an input or a user file
        from planner.elastic.state import check_journal

        inputs = (args.cluster, args.load, args.nodes_file, args.events_file, args.address_file, args.model,
                  args.node_dirs, *(args.profiles or ()))
        for path, what in ((args.state, "--state"), (args.state + ".lock", "--state's lock file"),
                           (args.state + ".tmp", "--state's temporary file")):
            if Path(path).parent.is_dir():  # (a missing directory is created, and holds no input)
                check_output(path, inputs, what)
        check_journal(args.state)
    if args.nodes_file or args.nodes_command:
        check_provider(args.nodes_file, args.nodes_command)
    padded_vocab, max_tp = job_vocabulary(model.vocab, divisor, args.max_tp, args.load)
    profiles = load_profiles(args.profiles, dict(cluster.gpus), model, "sailor")  # the workers run ours
    from planner.specs.precision import flags_precision

    precision = args.precision or flags_precision(train_args)  # None: the default rule per node set
    replanner = Replanner(model, cluster, profiles, args.global_batch, Goal(args.objective), precision, max_tp,
                          distributed_optimizer=DISTRIBUTED_OPTIMIZER in train_args)
    pools = parse_gpus(args.gpus, cluster) if args.gpus is not None else ()
    if args.local and not pools:
        raise SailorError("--local needs --gpus TYPE@ZONE=N,... to know which agents to start")
    if args.node_dirs is not None and not args.local:
        raise SailorError("--node-dirs names the disks of the agents --local starts; without --local start each "
                          "agent with --node-dir")
    if args.node_dirs is not None:
        try:
            os.makedirs(args.node_dirs, exist_ok=True)
        except OSError as e:
            raise SailorError(f"--node-dirs {args.node_dirs}: cannot create it ({e.strerror})") from None
    if args.gpus_per_node is not None and not args.local:
        raise SailorError("--gpus-per-node sizes the agents --local starts; without --local each agent says its own")
    nodes = local_nodes(pools, args.gpus_per_node, cluster) if args.local else []
    workers, most = sum(n for _, _, n in nodes), max(64, 8 * (os.cpu_count() or 1))
    if workers > most:  # each worker is a process that imports torch: thousands would only swamp the machine
        raise SailorError(f"--local --gpus {args.gpus} would start {workers} worker processes ({len(nodes)} agents) "
                          f"on this machine, more than the {most} it can take ({os.cpu_count()} CPU cores); give "
                          "fewer GPUs, or start agents on other machines with `sailor agent --store HOST:PORT`")
    if nodes:  # the GPUs given must hold a plan, or the job would only wait
        infos = [P.NodeInfo(f"node{i}", g, z, n) for i, (g, z, n) in enumerate(nodes)]
        if replanner.propose(infos) is None:
            raise SailorError(f"no plan runs on the GPUs given ({args.gpus}, {len(nodes)} node(s)): "
                              f"{replanner.explain(infos)}")
    settings = Settings(train_args, train_iters, args.heartbeat_s, args.heartbeat_misses,
                        reconfigure_cost_s=args.reconfigure_cost_s, worker_stall_s=args.worker_stall_s,
                        min_gpus=sum(p.count for p in pools), wait_s=args.wait_s, provider_file=args.nodes_file,
                        provider_command=args.nodes_command, provider_interval_s=args.nodes_interval_s,
                        padded_vocab=padded_vocab,
                        load=args.load)
    state, loaded = take_lead(args.state, train_args)
    host, port = args.host, args.port
    if not port and not args.state.startswith("etcd://") and b"ctl/address" in loaded:
        host, _, saved = loaded[b"ctl/address"].decode().rpartition(":")  # where the agents look for us
        port = int(saved)
    controller = Controller(settings, replanner, EventLog(args.events_file, quiet=args.quiet), host, port,
                            state, loaded)
    signal.signal(signal.SIGTERM, controller.request_finish)
    signal.signal(signal.SIGINT, controller.request_finish)
    host, port = controller.address
    controller.server.set("ctl/address", f"{host}:{port}")
    state.publish_address(f"{host}:{port}")
    adopted = controller.adopt()
    controller.server.set(P.LIVENESS, json.dumps({"beat_s": args.heartbeat_s, "stall_s": args.worker_stall_s}))
    controller.server.set(P.JOB_ARGS, json.dumps(train_args))  # workers read it first, then the above
    if args.address_file:
        write_output(args.address_file, f"{host}:{port}\n", what="--address-file")
    seq_source = seq_length_reason(model, args.seq_length)
    controller.events.emit("job_start", f"store at {host}:{port}; join nodes with `sailor agent --store "
                           f"{host}:{port} --gpus TYPE@ZONE=N`; {model.name}, sequence length {model.seq_len} "
                           f"({seq_source})", store=f"{host}:{port}", train_args=train_args,
                           padded_vocab=padded_vocab, model=model.name, seq_length=model.seq_len,
                           seq_length_source=seq_source)
    if not parsed.save_interval and not adopted:
        controller.events.emit("warning", "no --save-interval: a node lost mid-epoch sends the job back to step 0 (or "
                               "to its last reconfiguration); give -- --save-interval N to keep a snapshot in memory "
                               "every N steps (and --save DIR to write them to disk)", reason="no snapshots")
    if nodes and not adopted:
        store = args.state if args.state.startswith("etcd://") else f"{host}:{port}"
        controller.start_local_agents(nodes, args.heartbeat_s, args.cluster, store, args.node_dirs)
    return controller.run()


def take_lead(spec: str, train_args: list[str]):
    """Lead the job whose durable state `spec` names: (state, the store as the last controller left it;
    empty for a new job). A second controller of a live job is refused in one line."""
    from planner.elastic.state import open_state

    state = open_state(spec)
    state.lead()
    loaded = state.load()
    if loaded.get(P.JOB_DONE.encode()) is not None:  # that job ended: this is a new one
        state.reset()
        loaded = {}
    saved = loaded.get(P.JOB_ARGS.encode())
    if saved is not None and json.loads(saved) != train_args:
        raise SailorError(f"{state.describe()} holds a running job with other training arguments "
                          f"({' '.join(json.loads(saved))}); give the same ones to take it over, or another --state "
                          "for a new job")
    return state, loaded


def local_nodes(pools, gpus_per_node: int | None, cluster) -> list[tuple[str, str, int]]:
    """(GPU type, zone, GPUs) of each agent --local starts: whole nodes, then what is left of a pool."""
    nodes = []
    for pool in pools:
        size = gpus_per_node or cluster.gpu(pool.gpu).gpus_per_node
        full, extra = divmod(pool.count, size)
        nodes += [(pool.gpu, pool.zone, size)] * full + ([(pool.gpu, pool.zone, extra)] if extra else [])
    return nodes
