"""GPU/CPU hours and cost: the price table from the policy file, each try in the run's ledger, the metrics on
the MLflow run, and `trainpipe cost` summing them from a real MLflow store."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import mlflow
import pytest

from trainpipe.commands.main import main
from trainpipe.plan.costs import PriceTable, selects_spot_only
from trainpipe.plan.model import ResourcePlan
from trainpipe.policy.model import PolicyError, load_price_table
from trainpipe.settings import Settings
from trainpipe.state.usage import RunUsage, account_try, log_usage, read_tries, run_usage, version_usage_tags

GPU_JOB = ResourcePlan(gpus=16, cpus=64.0, gpu_resource="nvidia.com/gpu", spot=False, team="risk-ml")


def _policy(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    return path


def test_price_table_is_read_from_the_policy_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _policy(tmp_path, "teams: {risk: {folders: ['risk/**']}}\ncosts:\n  gpu_hour: {default: 2.0, nvidia.com/gpu: 3.0}\n"
                             "  cpu_hour: 0.05\n  spot_discount: 0.7\n")
    monkeypatch.setenv("TRAINPIPE_POLICY", str(path))
    prices = load_price_table(Settings.from_env().policy_path)
    assert prices == PriceTable(gpu_hour={"default": 2.0, "nvidia.com/gpu": 3.0}, cpu_hour=0.05, spot_discount=0.7)
    # 2 GPU-hours of A100s at 3.0 + 10 CPU-hours at 0.05; on spot 30% of that.
    assert prices.cost(gpu_hours=2, cpu_hours=10, gpu_resource="nvidia.com/gpu", spot=False) == pytest.approx(6.5)
    assert prices.cost(gpu_hours=2, cpu_hours=10, gpu_resource="nvidia.com/gpu", spot=True) == pytest.approx(1.95)
    assert prices.cost(gpu_hours=1, cpu_hours=0, gpu_resource="amd.com/gpu", spot=False) == pytest.approx(2.0)
    monkeypatch.delenv("TRAINPIPE_POLICY")
    assert load_price_table(Settings.from_env().policy_path) is None


def test_a_malformed_price_table_names_the_field(tmp_path: Path) -> None:
    # Read by the policy's own loader: located errors naming the field.
    team = "teams: {risk: {folders: ['risk/**']}}\n"
    with pytest.raises(PolicyError, match=r"policy.yaml:2:\d+: costs.spot_discount: .*less than or equal to 1"):
        load_price_table(_policy(tmp_path, team + "costs: {spot_discount: 1.5}\n"))
    with pytest.raises(PolicyError, match=r"policy.yaml:2:\d+: costs.gpu_hour: .*prices must be >= 0: default"):
        load_price_table(_policy(tmp_path, team + "costs: {gpu_hour: {default: -1}}\n"))
    with pytest.raises(PolicyError, match=r"policy.yaml:2:\d+: costs.gpu_hours: .*gpu_hour"):
        load_price_table(_policy(tmp_path, team + "costs: {gpu_hours: 1}\n"))
    # No price for the GPU and no default: no money is made up.
    assert PriceTable(gpu_hour={"amd.com/gpu": 1.0}).cost(gpu_hours=1, cpu_hours=0, gpu_resource="nvidia.com/gpu",
                                                          spot=False) is None


def test_spot_only_placement_is_recognised() -> None:
    assert selects_spot_only({"karpenter.sh/capacity-type": "spot"})
    assert selects_spot_only({}, [{"key": "cloud.google.com/gke-spot", "operator": "In", "values": ["true"]}])
    assert not selects_spot_only({"karpenter.sh/capacity-type": "on-demand"})
    assert not selects_spot_only({}, [{"key": "karpenter.sh/capacity-type", "operator": "In",
                                       "values": ["spot", "on-demand"]}])


def test_every_try_counts_and_the_run_gets_the_totals(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.sdk import ObjectStoragePath

    policy = "teams: {risk: {folders: ['risk/**']}}\ncosts: {gpu_hour: {default: 2.0}, cpu_hour: 0.5}\n"
    monkeypatch.setenv("TRAINPIPE_POLICY", str(_policy(tmp_path, policy)))
    run_dir = ObjectStoragePath(f"file://{tmp_path / 'run'}")
    client = mlflow.MlflowClient()
    run_id = client.create_run(client.create_experiment("usage-ledger")).info.run_id
    now = datetime.now(UTC)
    # A preempted first try of 30 min, then a second of 15 min: 16 GPUs x 0.75 h = 12 GPU-hours.
    account_try(run_dir, resources=GPU_JOB, pipeline_id="p", try_number=1, started_at=now - timedelta(minutes=30),
                outcome="preempted", client=client, mlflow_run_id=run_id, settings=Settings.from_env())
    usage = account_try(run_dir, resources=GPU_JOB, pipeline_id="p", try_number=2,
                        started_at=now - timedelta(minutes=15), outcome="succeeded", client=client, mlflow_run_id=run_id,
                        settings=Settings.from_env())
    assert [t.outcome for t in read_tries(run_dir)] == ["preempted", "succeeded"]
    assert usage.gpu_hours == pytest.approx(12, rel=1e-3) and usage.cpu_hours == pytest.approx(48, rel=1e-3)
    assert usage.cost == pytest.approx(12 * 2.0 + 48 * 0.5, rel=1e-3)
    metrics = client.get_run(run_id).data.metrics
    assert metrics["gpu_hours"] == pytest.approx(usage.gpu_hours) and metrics["cost"] == pytest.approx(usage.cost)
    assert client.get_run(run_id).data.tags["trainpipe.team"] == "risk-ml"
    assert version_usage_tags(client, run_id)["gpu_hours"] == f"{usage.gpu_hours:.6g}"
    # A try is recorded once: its callback after the operator's own record changes nothing.
    account_try(run_dir, resources=GPU_JOB, pipeline_id="p", try_number=2, started_at=now - timedelta(hours=5),
                outcome="succeeded", client=client, mlflow_run_id=run_id, settings=Settings.from_env())
    assert run_usage(run_dir, GPU_JOB, settings=Settings.from_env()).gpu_hours == pytest.approx(usage.gpu_hours)


def _logged_run(client: mlflow.MlflowClient, pipeline: str, team: str, usage: RunUsage) -> None:
    experiment = client.get_experiment_by_name(f"trainpipe/{pipeline}")
    experiment_id = experiment.experiment_id if experiment else client.create_experiment(f"trainpipe/{pipeline}")
    run_id = client.create_run(experiment_id).info.run_id
    log_usage(client, run_id, usage, pipeline_id=pipeline, team=team)


@pytest.fixture(scope="module")
def logged_costs() -> None:
    client = mlflow.MlflowClient()
    _logged_run(client, "cost_a", "team-x", RunUsage(gpu_hours=10.0, cpu_hours=40.0, cost=25.0, tries=1))
    _logged_run(client, "cost_a", "team-x", RunUsage(gpu_hours=2.5, cpu_hours=10.0, cost=6.25, tries=2))
    _logged_run(client, "cost_b", "team-y", RunUsage(gpu_hours=4.0, cpu_hours=16.0, cost=10.0, tries=1))
    _logged_run(client, "cost_c", "team-x", RunUsage(gpu_hours=0.0, cpu_hours=3.0, cost=None, tries=1))
    # Not a trainpipe experiment: never counted.
    other = client.create_run(client.create_experiment("someone-elses")).info.run_id
    client.log_metric(other, "gpu_hours", 1000.0)


def _groups(payload: dict) -> dict[str, dict]:
    return {g["name"]: g for g in payload["groups"] if g["name"].startswith(("cost_", "team-"))}


def test_cost_sums_by_pipeline_as_json(logged_costs, capsys) -> None:
    assert main(["cost", "--since", "1d", "--by", "pipeline", "--json"]) == 0
    groups = _groups(json.loads(capsys.readouterr().out))
    assert groups["cost_a"] == {"name": "cost_a", "runs": 2, "gpu_hours": 12.5, "spot_gpu_hours": 0.0,
                                "on_demand_gpu_hours": 12.5, "cpu_hours": 50.0, "cost": 31.25, "unpriced_runs": 0}
    assert groups["cost_b"]["gpu_hours"] == 4.0 and groups["cost_b"]["cost"] == 10.0
    assert groups["cost_c"] == {"name": "cost_c", "runs": 1, "gpu_hours": 0.0, "spot_gpu_hours": 0.0,
                                "on_demand_gpu_hours": 0.0, "cpu_hours": 3.0, "cost": 0.0, "unpriced_runs": 1}


def test_cost_sums_by_team(logged_costs, capsys) -> None:
    assert main(["cost", "--by", "team", "--json"]) == 0
    groups = _groups(json.loads(capsys.readouterr().out))
    assert (groups["team-x"]["runs"], groups["team-x"]["gpu_hours"], groups["team-x"]["cost"]) == (3, 12.5, 31.25)
    assert (groups["team-y"]["runs"], groups["team-y"]["cost"]) == (1, 10.0)
    assert main(["cost", "--by", "team"]) == 0
    out = capsys.readouterr().out
    assert "training usage by team" in out
    row = next(line for line in out.splitlines() if line.startswith("team-x "))
    assert row.split() == ["team-x", "3", "12.500", "0.000", "12.500", "53.000", "31.25", "(1", "run(s)", "without",
                           "a", "price)"]


def test_cost_since_leaves_older_runs_out(logged_costs, capsys) -> None:
    from trainpipe.state.cost_report import summarize_costs

    future = datetime.now(UTC) + timedelta(hours=1)
    assert summarize_costs(mlflow.MlflowClient(), by="pipeline", since=future).groups == []
    with pytest.raises(SystemExit) as stopped:
        main(["cost", "--since", "soon"])
    assert stopped.value.code == 2
    assert "expected a duration such as '30d'" in capsys.readouterr().err


def test_spot_and_on_demand_tries_are_priced_apart(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """A run that fell back to on-demand capacity (training.kubernetes.capacity) pays the spot price for its
    spot tries only; the split reaches the MLflow run, the version's tags and `trainpipe cost`."""
    from airflow.sdk import ObjectStoragePath

    # The stack's own price table (deploy/policy.yaml): 2.5 per GPU-hour, spot_discount 0.6.
    monkeypatch.setenv("TRAINPIPE_POLICY", str(Path(__file__).resolve().parents[2] / "deploy" / "policy.yaml"))
    spot_job = ResourcePlan(gpus=8, cpus=0.0, gpu_resource="nvidia.com/gpu", spot=True, team="risk-ml")
    run_dir = ObjectStoragePath(f"file://{tmp_path / 'run'}")
    client = mlflow.MlflowClient()
    run_id = client.create_run(client.create_experiment("trainpipe/spot_fallback")).info.run_id
    now = datetime.now(UTC)
    # Tries of 3 h and 2 h on spot (preempted), then 1 h on demand (each ends now): 40 spot GPU-hours at 1.0, 8 at 2.5.
    for number, (hours, outcome, capacity) in enumerate(
            [(3, "preempted", "spot"), (2, "preempted", "spot"), (1, "succeeded", "on_demand")], start=1):
        usage = account_try(run_dir, resources=spot_job, pipeline_id="spot_fallback", try_number=number,
                            started_at=now - timedelta(hours=hours), outcome=outcome, client=client,
                            mlflow_run_id=run_id, capacity=capacity, settings=Settings.from_env())
    entries = read_tries(run_dir)
    assert [t.capacity for t in entries] == ["spot", "spot", "on_demand"]
    assert usage.spot_gpu_hours == pytest.approx(40, rel=1e-3)
    assert usage.gpu_hours - usage.spot_gpu_hours == pytest.approx(8, rel=1e-3)
    assert usage.cost == pytest.approx(40 * 2.5 * 0.4 + 8 * 2.5, rel=1e-3)
    assert "GPU-hours on spot" in usage.describe() and "on demand" in usage.describe()
    tags = version_usage_tags(client, run_id)
    assert float(tags["spot_gpu_hours"]) == pytest.approx(40, rel=1e-3)
    assert float(tags["on_demand_gpu_hours"]) == pytest.approx(8, rel=1e-3)
    capsys.readouterr()  # the tries' log lines, where logging writes to stdout
    assert main(["cost", "--by", "pipeline", "--json"]) == 0
    group = next(g for g in json.loads(capsys.readouterr().out)["groups"] if g["name"] == "spot_fallback")
    assert group["spot_gpu_hours"] == pytest.approx(40, rel=1e-3)
    assert group["on_demand_gpu_hours"] == pytest.approx(8, rel=1e-3)
    assert group["cost"] == pytest.approx(usage.cost)
