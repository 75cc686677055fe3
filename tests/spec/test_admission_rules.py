"""What the Kubernetes API server, Airflow's scheduler or the train task would refuse only later (when the pod
is created, when the DAG is built, or never firing at all) is refused at the spec, at its line and field.

Each case was a spec that passed `trainpipe validate` and then failed with no line (a 'trainpipe bug' at 1:1),
or with the API server's message at run time, or registered a DAG that never runs."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support import REPO
from trainpipe.compile.compiler import compile_file
from trainpipe.errors import SpecError
from trainpipe.settings import Settings

GPU_SPEC = yaml.safe_load((REPO / "dag_configs" / "search_ranker_gpu.yaml").read_text())
FRAUD_SPEC = yaml.safe_load((REPO / "dag_configs" / "fraud_detector.yaml").read_text())


def _pods(spec: dict[str, Any]) -> dict[str, Any]:
    return spec["training"]["kubernetes"]


CASES: list[tuple[str, dict[str, Any], Callable[[dict[str, Any]], None], str, str]] = [
    ("memory limit below its request", GPU_SPEC,
     lambda s: _pods(s)["resources"].update(memory="64Gi", limits={"memory": "32Gi"}),
     "training.kubernetes.resources.limits.memory", "the memory limit 32Gi is below the request resources.memory 64Gi"),
    ("cpu limit below its request", GPU_SPEC,
     lambda s: _pods(s)["resources"].update(cpu="4", limits={"cpu": "500m"}),
     "training.kubernetes.resources.limits.cpu", "the cpu limit 500m is below the request resources.cpu 4"),
    ("node selector value with a space", GPU_SPEC,
     lambda s: _pods(s).update(node_selector={"gpu-type": "NVIDIA A100"}),
     "training.kubernetes.node_selector.gpu-type", "'NVIDIA A100' is not a Kubernetes label value"),
    ("capacity node selector key", GPU_SPEC,
     lambda s: _pods(s).update(capacity={"spot": {"node_selector": {"capacity type": "spot"}}, "on_demand": {}}),
     "training.kubernetes.capacity.spot.node_selector.capacity type", "'capacity type' is not a Kubernetes node label key"),
    ("toleration Exists with a value", GPU_SPEC,
     lambda s: _pods(s).update(tolerations=[{"key": "spot", "operator": "Exists", "value": "true"}]),
     "training.kubernetes.tolerations[0]", "operator Exists matches any value of the taint"),
    ("toleration_seconds without NoExecute", GPU_SPEC,
     lambda s: _pods(s).update(tolerations=[{"key": "spot", "value": "true", "toleration_seconds": 300}]),
     "training.kubernetes.tolerations[0]", "toleration_seconds applies only to effect NoExecute"),
    ("toleration Equal without a key", GPU_SPEC,
     lambda s: _pods(s).update(tolerations=[{"value": "true"}]),
     "training.kubernetes.tolerations[0]", "a toleration without a key tolerates every taint and needs operator Exists"),
    ("affinity In without values", GPU_SPEC,
     lambda s: _pods(s).update(affinity={"required": [{"key": "zone", "operator": "In"}]}),
     "training.kubernetes.affinity.required[0]", "operator In needs values"),
    ("affinity Exists with values", GPU_SPEC,
     lambda s: _pods(s).update(affinity={"required": [{"key": "zone", "operator": "Exists", "values": ["a"]}]}),
     "training.kubernetes.affinity.required[0]", "operator Exists looks at the key only"),
    ("affinity Gt with two values", GPU_SPEC,
     lambda s: _pods(s).update(affinity={"preferred": [{"key": "gpus", "operator": "Gt", "values": ["1", "2"]}]}),
     "training.kubernetes.affinity.preferred[0]", "operator Gt compares the node label with one whole number"),
    ("priority class with capitals", GPU_SPEC, lambda s: _pods(s).update(priority_class="ML_Trainer"),
     "training.kubernetes.priority_class", "'ML_Trainer' is not a DNS subdomain"),
    ("service account with capitals", GPU_SPEC, lambda s: _pods(s).update(service_account="ML_Trainer"),
     "training.kubernetes.service_account", "'ML_Trainer' is not a DNS subdomain"),
    ("secret key with a slash", GPU_SPEC, lambda s: _pods(s).update(secret_env={"HF_TOKEN": "hf-credentials/a/b"}),
     "training.kubernetes.secret_env.HF_TOKEN.key", "'a/b' is not a Secret key"),
    ("namespace over 63 characters", GPU_SPEC, lambda s: _pods(s).update(namespace="n" * 64),
     "training.kubernetes.namespace", "String should have at most 63 characters"),
    ("negative cpu", GPU_SPEC, lambda s: _pods(s)["resources"].update(cpu="-1"),
     "training.kubernetes.resources.cpu", "'-1' is not a Kubernetes quantity"),
    ("malformed memory with on_oom", GPU_SPEC,
     lambda s: (_pods(s)["resources"].update(memory="1..2", limits={}), _pods(s).update(on_oom={"max_memory": "96Gi"})),
     "training.kubernetes.resources.memory", "'1..2' is not a Kubernetes quantity"),
    ("infinite memory", GPU_SPEC, lambda s: _pods(s)["resources"].update(memory=float("inf"), limits={}),
     "training.kubernetes.resources.memory", "'inf' is not a Kubernetes quantity"),
    ("uid beyond int32", GPU_SPEC, lambda s: _pods(s).update(run_as_user=2**31),
     "training.kubernetes.run_as_user", "Input should be less than or equal to 2147483647"),
    ("pod restarts beyond int32", GPU_SPEC, lambda s: _pods(s).update(max_pod_restarts=2**31),
     "training.kubernetes.max_pod_restarts", "Input should be less than or equal to 2147483647"),
    ("more nodes than an Indexed Job holds", GPU_SPEC, lambda s: s["training"]["distributed"].update(nnodes=200_000),
     "training.distributed.nnodes", "Input should be less than or equal to 100000"),
    ("cron that never fires", FRAUD_SPEC, lambda s: s.update(schedule="0 0 31 4 *"),
     "schedule", "cron expression '0 0 31 4 *' never fires"),
    ("start date in year 1", FRAUD_SPEC, lambda s: s.update(start_date="0001-01-01", schedule="@weekly"),
     "start_date", "start_date 0001-01-01 is outside 1970-01-01 to 2999-12-31"),
    ("quoted keep_best false with early stopping", FRAUD_SPEC,
     lambda s: s["training"].update(early_stopping={"patience": 2}, checkpoint={"keep_best": "false"}),
     "training.early_stopping", "early stopping judges the validation loss"),
    ("quoted validation_fraction 0 with early stopping", FRAUD_SPEC,
     lambda s: s["training"].update(early_stopping={"patience": 2}, checkpoint={"validation_fraction": "0"}),
     "training.early_stopping", "early stopping judges the validation loss"),
    ("backtest alias as a list", FRAUD_SPEC,
     lambda s: s["registration"].update(backtest={"register": True, "alias": ["backtest"]}),
     "registration.backtest.alias", "Input should be a valid string"),
    ("infinite tuning choice", FRAUD_SPEC,
     lambda s: s.update(tuning={"n_trials": 4, "space": {"learning_rate": {"choice": [0.01, float("inf")]}}}),
     "tuning.space.learning_rate.choice", "inf is not a valid training.learning_rate: it must be a finite number"),
    ("NaN clip bound", FRAUD_SPEC, lambda s: s["training"].update(transforms={"amount": {"clip": [0, float("nan")]}}),
     "training.transforms.amount.clip.max", "Input should be a finite number"),
    ("asset schedule with a connection in the URI", FRAUD_SPEC,
     lambda s: s.update(schedule={"assets": ["s3://aws_admin@bucket/snapshot"]}),
     "schedule.assets[0]", "'s3://aws_admin@bucket/snapshot' names a connection or credentials"),
]


def _write(tmp_path: Path, spec: dict[str, Any]) -> Path:
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


@pytest.mark.parametrize(("base", "change", "field", "message"), [case[1:] for case in CASES],
                         ids=[case[0] for case in CASES])
def test_refused_at_its_field_with_the_fix(tmp_path: Path, base: dict[str, Any], change: Callable[[dict[str, Any]], None],
                                           field: str, message: str) -> None:
    spec = copy.deepcopy(base)
    change(spec)
    with pytest.raises(SpecError) as caught:
        compile_file(_write(tmp_path, spec), settings=Settings.from_env())
    problems = caught.value.problems
    assert any(p.field_path == field and p.message.startswith(message) for p in problems), problems
    assert all(p.line and p.line > 1 and "trainpipe bug" not in p.message for p in problems), problems


def test_what_kubernetes_admits_still_compiles_with_exact_quantities(tmp_path: Path) -> None:
    spec = copy.deepcopy(GPU_SPEC)
    pods = _pods(spec)
    pods["resources"].update(cpu="1k", memory=17179869184, limits={"cpu": "1000", "memory": "16Gi"})
    pods["tolerations"] = [{"operator": "Exists"}, {"key": "spot", "operator": "Exists", "effect": "NoExecute",
                                                    "toleration_seconds": 300}]
    pods["affinity"] = {"required": [{"key": "gpus", "operator": "Gt", "values": ["4"]},
                                     {"key": "zone", "operator": "DoesNotExist"}]}
    pods["node_selector"] = {"nvidia.com/gpu.product": "NVIDIA-L4", "node.kubernetes.io/instance-type": "g6.12xlarge"}
    plan = compile_file(_write(tmp_path, spec), settings=Settings.from_env())
    # Every digit of a numeric memory is kept (format "g" wrote 1.71799e+10), and 1k CPUs count as 1000.
    assert plan.kubernetes is not None and plan.kubernetes.resources["memory"] == "17179869184"
    nodes = spec["training"]["distributed"].get("nnodes", 1)
    assert plan.resources.cpus == 1000 * nodes
