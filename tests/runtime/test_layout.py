"""The rank layout of a plan and the `sailor launch` command lines (no torch)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from _runtime_helpers import ROOT, plan_dict

from planner.errors import SailorError
from planner.launch import check_runnable, node_commands, rank_layout, uniform_plan
from planner.specs.model import get_model
from planner.specs.plan import Pipeline, Plan, Replica, Stage, plan_from_dict


def geo_plan() -> Plan:
    """2 stages x 3 replicas over two GPU types and zones, TP 1..4."""
    a, v = ("A100-40", "us-central1-a"), ("V100-16", "us-west1-b")
    stages = (
        Stage(0, 12, (Replica(a[0], 4, a[1]), Replica(a[0], 2, a[1]), Replica(v[0], 4, v[1]))),
        Stage(13, 25, (Replica(a[0], 2, a[1]), Replica(a[0], 1, a[1]), Replica(v[0], 2, v[1]))),
    )
    return Plan("opt-350m", 48, stages, (Pipeline(4, 4), Pipeline(2, 8), Pipeline(1, 16)))


def test_layout_covers_every_rank_once_and_keeps_tp_groups_on_one_node():
    plan = geo_plan()
    layout = rank_layout(plan)
    assert layout.world_size == plan.num_gpus == 15
    assert [s.rank for s in layout.slots] == list(range(15))
    assert len({(s.stage, s.replica, s.tp_rank) for s in layout.slots}) == 15
    for s in range(plan.pp):
        for k in range(plan.dp):
            group = layout.tp_group(s, k)
            assert len(group) == plan.stages[s].replicas[k].tp
            assert len({layout.slots[r].node for r in group}) == 1  # TP inside a node
            assert list(group) == list(range(group[0], group[0] + len(group)))  # consecutive ranks
    for node in layout.nodes:  # torchrun numbers ranks node by node
        slots = [layout.slots[r] for r in node.ranks]
        assert [s.local_rank for s in slots] == list(range(node.nproc))
        assert {(s.gpu, s.zone) for s in slots} == {(node.gpu, node.zone)}
        assert node.nproc <= 8


def test_layout_matches_the_simulators_placement():
    placement = pytest.importorskip("planner.simulator.placement")
    from planner.specs.hardware import Cluster

    plan = geo_plan()
    layout = rank_layout(plan)
    nodes = placement.place(plan, Cluster())
    for slot in layout.slots:
        assert slot.node == nodes[slot.stage][slot.replica]


def test_uniform_plan_from_megatron_sizes():
    model = get_model("tiny")
    plan = uniform_plan(model, 8, tp=2, pp=2, global_batch_size=16, micro_batch_size=2)
    assert plan.pp == 2 and plan.dp == 2 and plan.num_gpus == 8
    assert [(s.first, s.last) for s in plan.stages] == [(0, 2), (3, 5)]
    assert {p for p in plan.pipelines} == {Pipeline(2, 4)}
    with pytest.raises(SailorError, match="not a multiple"):
        uniform_plan(model, 6, tp=4, pp=1, global_batch_size=16, micro_batch_size=2)


def test_runtime_rejects_split_that_misses_layers_and_bad_tp():
    model = get_model("tiny")
    short = plan_from_dict(plan_dict([((0, 3), [1])], [(4, 1)]))
    with pytest.raises(SailorError, match="the model has 6 layers"):
        check_runnable(short, model)
    bad_tp = plan_from_dict(plan_dict([((0, 5), [8])], [(4, 1)]))
    with pytest.raises(SailorError, match="TP 8"):
        check_runnable(bad_tp, model)


def test_node_commands_name_each_node():
    layout = rank_layout(geo_plan())
    cmds = node_commands(layout, "plan.json", ["--train-iters", "5"], "10.0.0.1", 29500)
    assert len(cmds) == len(layout.nodes)
    for node, cmd in zip(layout.nodes, cmds):
        assert f"--node-rank={node.index}" in cmd and f"--nproc-per-node={node.nproc}" in cmd
        assert cmd[cmd.index("-m"):] == ["-m", "sailor_ext.train", "--plan", "plan.json", "--train-iters", "5"]


def test_launch_cli_prints_torchrun_per_node(tmp_path):
    from planner.specs.plan import save_plan

    save_plan(geo_plan(), str(tmp_path / "plan.json"))
    out = subprocess.run([sys.executable, "-m", "planner.cli", "launch", str(tmp_path / "plan.json"), "--master-addr",
                          "head", "--", "--train-iters", "10"], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    lines = [line for line in out.stdout.splitlines() if line.startswith("torchrun")]
    assert len(lines) == len(rank_layout(geo_plan()).nodes)
    assert all("--master-addr=head" in line and "-m sailor_ext.train --plan" in line
               and line.endswith("--train-iters 10") for line in lines)


def test_launch_cli_bad_plan_is_one_line(tmp_path):
    (tmp_path / "plan.json").write_text(json.dumps(plan_dict([((0, 3), [1])], [(4, 1)])))
    out = subprocess.run([sys.executable, "-m", "planner.cli", "launch", str(tmp_path / "plan.json")],
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 2
    assert out.stderr.startswith("sailor: error: plan: stages cover layers 0..3")
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1
