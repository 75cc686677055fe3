from __future__ import annotations

from pathlib import Path

from trainpipe.factory import compile_file
from trainpipe.plan import CHECKPOINT_SENSOR, TASK_ORDER, run_key, trainer_command

REPO = Path(__file__).resolve().parent.parent


def test_plan_of_fraud_example():
    plan = compile_file(REPO / "dag_configs" / "fraud_detector.yaml")
    assert [t.task_id for t in plan.tasks] == ["snapshot", "validate", "train", CHECKPOINT_SENSOR, "evaluate", "gate", "register"]
    assert [t.upstream for t in plan.tasks] == [(), ("snapshot",), ("validate",), ("validate",), ("train",), ("evaluate",), ("gate",)]
    assert TASK_ORDER == ("snapshot", "validate", "train", "evaluate", "gate", "register")
    assert plan.launch.launcher == "local"
    assert plan.launch.command[:4] == ("torchrun", "--nnodes=1", "--nproc_per_node=2", "--standalone")
    assert plan.launch.command[4:7] == ("-m", "trainpipe_trainer", "--config")
    assert plan.to_dict()["spec"]["training"]["seed"] == 42


def test_trainer_command_is_torchrun_module_with_config():
    assert trainer_command(nproc_per_node=4, nnodes=1, config_uri="s3://b/c.json") == [
        "torchrun", "--nnodes=1", "--nproc_per_node=4", "--standalone", "-m", "trainpipe_trainer", "--config", "s3://b/c.json"
    ]


def test_run_key_is_path_safe_and_stable():
    key = run_key("scheduled__2026-11-22T00:00:00+00:00")
    assert key == run_key("scheduled__2026-11-22T00:00:00+00:00")
    assert "/" not in key and ":" not in key and "+" not in key
