"""An elastic worker: one process per GPU that outlives plans.

Its node's agent (planner/elastic/agent.py) starts it before any plan exists,
so it pays for importing torch and megatron once, not at every
reconfiguration. Then, epoch after epoch:

  1. wait for the controller to publish a plan (store key plan/<e>) that
     gives it a rank (a worker without one stays idle and warm);
  2. form the process groups through the controller's store, under the
     prefix pg/<e>/;
  3. build the stage model for the plan and restore the state: from the
     ranks' host-memory snapshots (reshard.exchange) or, where those do not
     cover the plan or are older, from the newest checkpoint on disk that
     verifies;
  4. train. A stop request (stop/<e>) is watched by a thread: "drain" raises
     a flag that is agreed in the step's all-reduce, so every rank stops
     after the same step and snapshots it (nothing lost); "abort" (a peer is
     gone) also makes pending collectives fail at once (abort.py);
  5. destroy the process groups and go back to 1.

It exits when the job is done or when its node is fenced. When the
controller dies it trains on: nothing in a step touches the store (rank 0's
reports go through a background thread), every connection is re-established
with backoff, and a new controller re-adopts the epoch. Started by an agent,
it dies with it (the kernel sends SIGKILL when the agent exits,
PR_SET_PDEATHSIG).

A thread of its own heartbeats (wb/<node>/<i>): a frozen process stops
beating and the controller has its agent restart it. The same thread
reports a training thread that makes no progress for the job's stall limit
(failed/<e>/<rank>), which ends the epoch long before a collective timeout.

    python -m sailor_ext.elastic.worker --store HOST:PORT --node ID --index I
"""
from __future__ import annotations

import argparse
import ctypes
import datetime
import faulthandler
import gc
import json
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, replace

from planner.elastic import protocol as P
from planner.elastic.store import StoreClient, StoreClosed, StoreTimeout
from planner.errors import SailorError

EXIT_LOST_CONTROLLER, EXIT_FENCED = 4, 5


def die_with_parent() -> None:
    """SIGKILL this process when its parent (the agent) exits (Linux)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def log(line: str) -> None:
    print(f"sailor: {line}", file=sys.stderr, flush=True)


EXIT_WEDGED = 6
WEDGED_GRACE_S = 1.0


class StopWatcher:
    """Watches stop/<e> of the current epoch on its own store connection.

    Last resort: if the training thread has not left an aborted epoch
    `grace` seconds later (max(WEDGED_GRACE_S, twice the slowest step): a
    healthy thread leaves within one step plus abort.ABORT_TIMEOUT_S), it is
    stuck in a collective nothing could wake. gloo sometimes leaves an
    operation waiting for its full timeout on a connection that is already
    gone (the process then holds no connection at all but the store's; seen
    in 1 to 2 node kills out of 10 here). The process exits and its agent
    starts a fresh one: a restart instead of an in-place reconfiguration,
    for this worker only; the controller plans without its node until the
    fresh worker is ready, then folds it back in."""

    def __init__(self, client: StoreClient, keep_fds: set[int]):
        self.client, self.keep_fds = client, keep_fds
        self.lock = threading.Lock()
        self.epoch: int | None = None
        self.stop = threading.Event()  # the current epoch must end
        self.left = threading.Event()  # the training thread left the epoch
        self.cancelled: threading.Event | None = None  # set on abort: ends store waits of the epoch
        self.grace = WEDGED_GRACE_S
        self.thread = threading.Thread(target=self._run, name="stop-watcher", daemon=True)
        self.thread.start()

    def watch(self, epoch: int | None, cancelled: threading.Event | None = None) -> None:
        with self.lock:
            self.epoch, self.cancelled = epoch, cancelled
            self.stop.clear()
            if epoch is None:
                self.left.set()
            else:
                self.left.clear()

    def _run(self) -> None:
        while True:
            epoch = self.epoch
            if epoch is None or self.stop.is_set():
                time.sleep(0.01)
                continue
            try:
                how = self.client.get(P.stop_key(epoch), 0.05).decode()
            except StoreTimeout:
                continue
            except StoreClosed:
                how = P.ABORT
            from sailor_ext.elastic.abort import abort_collectives

            with self.lock:
                if self.epoch != epoch:
                    continue
                self.stop.set()
                if how != P.ABORT:
                    # drain/finish: an epoch still forming completes its rendezvous and restore, then
                    # stops after its first step (every rank agrees on it), so nothing is lost
                    continue
                if self.cancelled is not None:
                    self.cancelled.set()
                abort_collectives(self.keep_fds)
            if not self.left.wait(self.grace):
                log(f"epoch {epoch}: training is still stuck in a collective {self.grace:g} s after the abort; "
                    "exiting so the agent starts a fresh worker")
                if os.environ.get("SAILOR_DEBUG"):
                    faulthandler.dump_traceback(all_threads=True)
                os._exit(EXIT_WEDGED)


class Beat:
    """The worker's own heartbeat, rank 0's reports to the controller, and the stall check, on one
    background thread and connection, so that the training thread never waits for the store."""

    def __init__(self, client: StoreClient, node: str, index: int):
        self.client, self.node, self.index = client, node, index
        liveness = json.loads(client.try_get(P.LIVENESS) or '{"beat_s": 0.5, "stall_s": 30}')  # the defaults
        self.period, self.stall_s = float(liveness["beat_s"]), float(liveness["stall_s"])
        self.lock = threading.Lock()
        self.pending: dict[str, str] = {}  # key -> newest value, sent in order of first posting
        self.wake = threading.Event()
        self.training: tuple[int, int] | None = None  # (epoch, rank) while the training loop runs
        self.progress_at = time.monotonic()
        self.slowest = 0.0  # seconds of the slowest step seen
        self.reported: int | None = None  # the epoch whose stall was reported
        self.thread = threading.Thread(target=self._run, name="beat", daemon=True)
        self.thread.start()

    def post(self, key: str, value: str) -> None:
        with self.lock:
            self.pending[key] = value
        self.wake.set()

    def progressed(self) -> None:
        """The training thread finished a step (with its save and validation, if any)."""
        now = time.monotonic()
        if self.training is not None:  # the slowest step so far sets the stall limit (10 x)
            self.slowest = max(self.slowest, now - self.progress_at)
        self.progress_at = now

    def _run(self) -> None:
        try:
            self._beat()
        except StoreClosed as e:  # the controller is gone for good: the agent stops the worker (--controller-wait-s)
            log(f"heartbeat stopped: {e}")

    def _beat(self) -> None:
        beats = 0
        while True:
            beats += 1
            self.wake.clear()
            with self.lock:
                pending, self.pending = self.pending, {}
            for key, value in pending.items():
                self.client.set(key, value)
            self.client.set(P.worker_beat_key(self.node, self.index), str(beats))
            training, limit = self.training, max(self.stall_s, 10 * self.slowest)
            idle = time.monotonic() - self.progress_at
            if training is not None and idle > limit and self.reported != training[0]:
                self.reported = training[0]
                log(f"rank {training[1]} (epoch {training[0]}): no training progress for {idle:.1f} s; reporting it")
                self.client.set(P.failed_key(*training), f"no training progress for {idle:.1f} s (limit {limit:g} s)")
            self.wake.wait(self.period)


@dataclass
class EpochResult:
    outcome: str  # finished | stopped | failed
    detail: str = ""
    requested: bool = False  # the controller had asked the epoch to stop


class Worker:
    def __init__(self, store: str, node: str, index: int, controller_wait_s: float = 0.0):
        from planner.elastic.state import locator

        self.store_spec, self.node, self.index = store, node, index
        locate = locator(store)

        def connect(identity: str = "", say=None, give_up_s: float = controller_wait_s) -> StoreClient:
            return StoreClient("", 0, identity, locate=locate, say=say, give_up_s=give_up_s)

        client = connect(P.worker_identity(node, index), say=lambda line: log(f"worker {node}/{index}: {line}"))
        args_json = client.get(P.JOB_ARGS, 60.0)
        from sailor_ext.train import parse_args

        self.args = parse_args(json.loads(args_json))
        # the heavy imports, once per process
        import torch.distributed  # noqa: F401

        from sailor_ext.elastic.store import ControllerStore
        from sailor_ext.snapshot import SnapshotRing
        from sailor_ext import trainer  # noqa: F401  (megatron)

        # The imports left ~10^6 long-lived objects; without this every full
        # collection walks them all (0.2-0.3 s per reconfiguration here).
        gc.collect()
        gc.freeze()

        self.store = ControllerStore(client, self.args.dist_timeout)
        self.client = client
        # the board's collection gives up after BOARD_GIVE_UP_S without a controller (see OutageBoard)
        self.watch_client, self.board_client, beat_client = connect(), connect(give_up_s=BOARD_GIVE_UP_S), connect()
        self.watcher = StopWatcher(self.watch_client, _StoreSockets((client, self.watch_client, self.board_client,
                                                                     beat_client)))
        self.beat = Beat(beat_client, node, index)
        self.ring = SnapshotRing()
        self.data = None  # the training data, opened (and its vocabulary checked) in the first epoch
        self.ended_at = self.left_at = 0.0  # when the last epoch failed or stopped, and when it was torn down
        client.set(P.ready_key(node, index), str(os.getpid()))

    # -- between epochs -------------------------------------------------------------
    def next_assignment(self, after: int) -> P.Assignment | None:
        """The newest plan after epoch `after`; None when the job is over for us."""
        while True:
            if self.client.check([P.JOB_DONE]):
                return None
            if self.client.check([P.fence_key(self.node)]):
                log(f"worker {self.node}/{self.index}: the controller fenced this node "
                    f"({self.client.get(P.fence_key(self.node), 1.0).decode()}); exiting")
                raise SystemExit(EXIT_FENCED)
            try:
                self.client.get(P.plan_key(after + 1), 0.05)
            except StoreTimeout:
                continue
            newest = max(after + 1, int(self.client.get(P.EPOCH, 5.0)))
            return P.Assignment.from_json(self.client.get(P.plan_key(newest), 5.0))

    def run(self) -> int:
        epoch = 0
        try:
            while True:
                a = self.next_assignment(epoch)
                if a is None:
                    return 0
                epoch = a.epoch
                rank = a.rank_of(self.node, self.index)
                if rank is None:
                    continue  # idle in this plan; stay warm
                result = self.run_epoch(a, rank)
                if result.outcome == "failed" and not result.requested:
                    self.client.set(P.failed_key(epoch, rank), result.detail[:500])
        except StoreClosed:
            log(f"worker {self.node}/{self.index}: no controller at {self.store_spec}; exiting")
            return EXIT_LOST_CONTROLLER

    # -- one epoch ------------------------------------------------------------------
    def run_epoch(self, a: P.Assignment, rank: int) -> EpochResult:
        import torch.distributed as dist

        from planner.launch import rank_layout
        from planner.specs.hardware import load_cluster
        from planner.specs.plan import plan_from_dict, plan_model
        from sailor_ext import compat, devices
        from sailor_ext.snapshot import Persister, PersistTarget
        from sailor_ext.data import open_training_data
        from sailor_ext.train import follow_plan_precision
        from sailor_ext.trainer import Trainer

        args, e = self.args, a.epoch
        cancelled = self.store.cancelled
        cancelled.clear()
        self.watcher.watch(e, cancelled)
        t0 = time.time()
        previous = {"t_prev_end": self.ended_at, "t_prev_left": self.left_at}
        trainer = persister = None
        result = EpochResult("failed")
        try:
            plan = plan_from_dict(a.plan)
            model = plan_model(plan, args.model, args.seq_length)
            cluster = load_cluster(args.cluster or os.environ.get("SAILOR_CLUSTER"))  # (the agent's --cluster)
            cluster = replace(cluster, gpus={**cluster.gpus, **{
                g: replace(cluster.gpu(g), gpus_per_node=n) for g, n in a.gpus_per_node.items()}})
            layout = rank_layout(plan, cluster)
            device = compat.pick_device(self.index)
            backend = devices.backend_for(device, args.distributed_backend)
            devices.configure(device)
            if not dist.is_initialized():
                # Groups are named by torch's global counter, which destroy_process_group() resets; an
                # epoch abandoned inside init_process_group advanced it without a destroy, and this rank
                # would then name its groups unlike its peers and wait for keys no one writes.
                dist.distributed_c10d._world.group_count = 0
            dist.init_process_group(backend, store=dist.PrefixStore(f"pg/{e}/", self.store), rank=rank,
                                    world_size=a.world_size, timeout=datetime.timedelta(seconds=args.dist_timeout),
                                    device_id=device if backend == "nccl" else None)
            t_pg = time.time()
            self.locate_nodes(a)
            if rank >= a.plan_world:
                result = self.donate(a, layout, rank, device, model.tied_embeddings)
                return result
            if args.save:
                persister = Persister(
                    PersistTarget(args.save, rank, a.plan_world, e, args.keep_checkpoints, args.dist_timeout),
                    *outage_board(self.beat, self.board_client, f"ckpt/{e}/", log if rank == 0 else _quiet,
                                  args.train_iters))
            if self.data is None:
                self.data = open_training_data(args, model)
            own = replace_ns(args, load=None, load_hf=None)
            follow_plan_precision(own, plan)  # train in what the plan was sized for (sailor run --precision, or
            # the default for its GPU types: fp16 with a V100), as sailor_ext.train does with a plan
            trainer = Trainer(own, plan, model, layout, rank, device, self.ring, persister, a.padded_vocab, self.data)
            if persister is not None:
                persister.meta = {**trainer.checkpoint_meta(), "hf_source": getattr(args, "load_hf", None)}
            t_built = time.time()
            source = self.restore(trainer, a, rank, device)
            t_loaded = time.time()
            result = self.train(trainer, a, rank, {"epoch": e, "rank": rank, "world": a.world_size,
                                                   "source": source, "step": trainer.step, "t_start": t0,
                                                   "pg_s": t_pg - t0, "build_s": t_built - t_pg,
                                                   "load_s": t_loaded - t_built, **previous})
        except (SailorError, devices.StrictDeviceError) as err:
            # a user mistake (e.g. a checkpoint of another model), or in strict mode a tensor NCCL would
            # refuse (a bug): retrying cannot help
            result = EpochResult("failed", f"{P.FATAL}{err}")
        except Exception as err:  # a peer died, hung or the epoch was superseded
            self.ended_at = time.time()
            first = (str(err).strip().splitlines() or [type(err).__name__])[0]
            if not self.watcher.stop.is_set():
                log(f"rank {rank} (epoch {e}): {first[:300]}; waiting for the controller's next plan")
            result = EpochResult("failed", f"{type(err).__name__}: {first[:300]}")
        finally:
            result.requested = self.watcher.stop.is_set()
            if trainer is not None and trainer.metrics.file:
                trainer.metrics.file.close()
            if persister is not None:
                if result.outcome == "failed":
                    persister.close(cancel=True)
                else:
                    persister.flush(args.dist_timeout)
                    persister.close()
            del trainer
            if dist.is_initialized():
                try:
                    dist.destroy_process_group()
                except Exception:
                    pass
            self.watcher.watch(None)
            gc.collect()
            self.left_at = time.time()
        return result

    def locate_nodes(self, a: P.Assignment) -> None:
        """For checkpoints on the nodes' own disks (--save node:NAME, storage.NodeStorage): this node's
        --node-dir, and the epoch's other nodes in job order from the next one on, which is the buddy
        that gets a copy of every file written here. (--load node:NAME is refused by the controller.)"""
        if not str(self.args.save or "").startswith("node:"):
            return
        from sailor_ext.storage import configure_nodes

        node_dir = os.environ.get("SAILOR_NODE_DIR")
        if not node_dir:
            raise SailorError(f"--save {self.args.save} keeps checkpoints on the nodes' own disks: start every "
                              "node's agent with --node-dir DIR")
        order = list(dict.fromkeys(n for n, _ in a.ranks + a.donors))
        at = order.index(self.node)
        peers = []
        for node in order[at + 1:] + order[:at]:
            info = P.NodeInfo.from_json(self.client.get(P.node_key(node), 5.0))
            if not info.files:
                raise SailorError(f"--save {self.args.save}: node {node}'s agent has no --node-dir; start every "
                                  "node's agent with one")
            peers.append((info.files, info.files_token))
        configure_nodes(node_dir, peers, 0 if peers else None)

    def restore(self, trainer, a: P.Assignment, rank: int, device) -> str:
        """Fill the trainer from memory or disk (collective over every rank,
        donors too; trainer is None on a donor); returns where the state came from."""
        import torch.distributed as dist

        from sailor_ext import checkpoint
        from sailor_ext.elastic import reshard
        from sailor_ext.trainer import log as say

        # What the disk claims (cheap: the name in `latest`); verified only if it is needed.
        disk = [None, -1]
        if rank == 0:
            for d in (self.args.save, a.load):
                if d and (claim := checkpoint.claimed(d)) is not None:
                    disk = [d, claim[1]]
                    break
        dist.broadcast_object_list(disk, src=0)
        nodes = [a.node_index(r) for r in range(a.world_size)]
        target = (trainer.params, trainer.optimizer, trainer.model.shards) if trainer else (None, None, None)
        info = reshard.exchange(self.ring, *target, nodes, device, min_step=disk[1])
        source = "memory"
        if info is None and disk[0] is not None:
            choice = [None]  # the newest checkpoint that verifies: maybe older than `latest` claims
            if rank == 0:
                try:
                    choice = [checkpoint.choose(disk[0])]
                except Exception as e:  # every rank must leave the broadcast
                    choice = [e]
            dist.broadcast_object_list(choice, src=0)
            if isinstance(choice[0], Exception):
                raise choice[0]
            if choice[0].step < disk[1]:
                info = reshard.exchange(self.ring, *target, nodes, device, min_step=choice[0].step)
                if info is not None and rank == 0:
                    for note in choice[0].notes():
                        say(note)
            if info is None and trainer is not None:
                trainer.load(disk[0], choice[0])  # says what it skipped
            source = "disk" if info is None else source
        if trainer is None:
            return source
        if info is not None:
            trainer.resume_at(info.step, info.consumed, info.loss_scaler)
        elif disk[0] is None:
            source = "init"
            if getattr(self.args, "load_hf", None):
                trainer.load_hf(self.args.load_hf)
                source = "hf"
            elif self.ring.slots:
                log(f"rank {rank}: no snapshot or checkpoint covers the plan; starting from step 0")
        self.ring.clear()
        trainer.snapshot()  # the restored state, under the new plan
        return source

    def donate(self, a: P.Assignment, layout, rank: int, device, tied: bool) -> EpochResult:
        """Outside the plan: create its groups, hand over this worker's snapshots, then wait out the epoch."""
        from sailor_ext.topology import Topology

        Topology(layout, rank, device, tied, datetime.timedelta(seconds=self.args.dist_timeout))
        self.restore(None, a, rank, device)
        while not self.watcher.stop.wait(0.05):
            if self.client.check([P.JOB_DONE]) or self.client.check([P.finished_key(a.epoch)]):
                return EpochResult("finished")
        self.ended_at = time.time()
        return EpochResult("stopped")

    def train(self, trainer, a: P.Assignment, rank: int, report: dict) -> EpochResult:
        self.beat.progressed()
        self.beat.training = (a.epoch, rank)  # from here on, a step that takes too long is a stall
        try:
            return self._train(trainer, a, rank, report)
        finally:
            self.beat.training = None

    def _train(self, trainer, a: P.Assignment, rank: int, report: dict) -> EpochResult:
        args, watcher = self.args, self.watcher
        samples = [p.samples for p in trainer.plan.pipelines]
        tokens = trainer.plan.global_batch_size * trainer.model_spec.seq_len
        first = True
        while trainer.step < args.train_iters:
            r = trainer.train_step(stop=watcher.stop.is_set())
            watcher.grace = max(watcher.grace, 2 * r.seconds)
            record = {**r.record(), "tokens": tokens, "samples_per_replica": samples, "epoch": a.epoch,
                      "time": time.time(), **trainer.peak_memory()}
            last = r.step == args.train_iters
            if (args.save_interval and r.step % args.save_interval == 0) or (last and args.save):
                record["save_blocked_s"] = trainer.save()
            elif r.stop or last:
                trainer.snapshot()  # the step to resume from, in memory
            if (val_loss := trainer.validate(r.step)) is not None:
                record["val_loss"] = val_loss
            trainer.metrics.write(record)
            self.beat.progressed()
            if rank == 0 and args.log_interval and r.step % args.log_interval == 0:
                print(f"step {r.step}/{args.train_iters} | {r.line()} | {r.seconds:.3f} s | epoch {a.epoch}",
                      flush=True)
            if rank == 0:  # through the beat thread: a step never waits for the controller
                if first:
                    self.beat.post(P.report_key(a.epoch), json.dumps(
                        {**report, "t_first_step": time.time(), "first_step_s": r.seconds}))
                self.beat.post(f"progress/{a.epoch}", str(r.step))
            first = False
            if r.stop and not last:
                if self.client.get(P.stop_key(a.epoch), 5.0).decode() == P.FINISH:
                    if args.save and "save_blocked_s" not in record:
                        trainer.save()
                    break
                self.ended_at = time.time()
                return EpochResult("stopped", f"step {r.step}")
        if trainer.persister is not None:
            trainer.persister.flush(args.dist_timeout)
        if rank == 0:
            self.client.set(P.finished_key(a.epoch), str(trainer.step))
        return EpochResult("finished")


BOARD_GIVE_UP_S = 1.0


def _quiet(line: str) -> None:
    pass


def outage_board(beat: Beat, client: StoreClient, prefix: str, say, last_step: int):
    """(checkpoint board, meta, log) for a Persister, in a job whose controller may be away.

    A rank's report goes through the beat thread, so writing a checkpoint never waits for the store;
    rank 0's collection of the reports gives up at once when the store does not answer (or after
    BOARD_GIVE_UP_S if the controller goes away during the collection). A checkpoint taken during an
    outage is then written but not committed, and the in-memory ring (two snapshots) never holds
    training up waiting for a controller; the first checkpoint after a controller is back commits as
    usual. The checkpoint of the last step waits for a controller (up to the collection's deadline):
    no training is left to hold up, and it is the job's result."""
    from sailor_ext.snapshot import StoreBoard

    declined: set[int] = set()

    class OutageBoard(StoreBoard):
        def report(self, step, rank, record) -> None:
            beat.post(self._key(step, rank), json.dumps(record.__dict__))

        def collect(self, step, world, deadline, cancelled):
            try:
                while step >= last_step and not client.reachable() and time.monotonic() < deadline \
                        and not cancelled.is_set():
                    time.sleep(0.1)
                if not client.reachable():
                    raise StoreClosed("no controller")
                return super().collect(step, world, deadline, cancelled)
            except StoreClosed:
                declined.add(step)
                say(f"checkpoint of step {step} not committed: no controller answers (its files are written)")
                return None

    def persister_log(line: str) -> None:  # the Persister's own line for a declined collection says "within T s"
        if not any(line.startswith(f"checkpoint of step {s} not committed: not every rank") for s in declined):
            say(line)

    return OutageBoard(client, prefix), {}, persister_log


class _StoreSockets:
    """The file descriptors of the store connections, which an abort must not sever; read when
    needed, since a reconnection replaces a socket."""

    def __init__(self, clients):
        self.clients = clients

    def __contains__(self, fd: int) -> bool:
        return any(c.sock.fileno() == fd for c in self.clients)


def replace_ns(ns: argparse.Namespace, **changes) -> argparse.Namespace:
    out = argparse.Namespace(**vars(ns))
    for k, v in changes.items():
        setattr(out, k, v)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m sailor_ext.elastic.worker", description=__doc__.splitlines()[0])
    p.add_argument("--store", required=True, help="HOST:PORT of the controller's store")
    p.add_argument("--node", required=True)
    p.add_argument("--index", type=int, required=True)
    p.add_argument("--parent", type=int, default=0, help="the agent's pid: exit if it is already gone")
    p.add_argument("--controller-wait-s", type=float, default=0.0,
                   help="exit after this long without a controller (0: wait on)")
    opts = p.parse_args(argv)
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # `kill -USR1 PID`: where is it stuck?
    if opts.parent:
        die_with_parent()
        if os.getppid() != opts.parent:
            return EXIT_LOST_CONTROLLER  # the agent died before we could tie ourselves to it
    try:
        worker = Worker(opts.store, opts.node, opts.index, opts.controller_wait_s)
        return worker.run()
    except StoreClosed as e:
        log(f"worker {opts.node}/{opts.index}: {e}; exiting")
        return EXIT_LOST_CONTROLLER
    except SystemExit as e:
        return int(e.code or 0)


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # skip destructors of process groups a dead peer may have wedged
