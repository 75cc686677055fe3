"""The example model-family package (examples/acme_families) as a team ships it: built into a wheel, installed
from that wheel into a folder of its own (never into the test venv) that PYTHONPATH names for every process, and
found by its entry point. Its params are checked with located errors; trained by the harness under torchrun with
2 CPU ranks, a rank SIGKILLed after a commit resumes to the uninterrupted run's weights, under DDP and DeepSpeed
ZeRO-2; the logged model serves probabilities through torch; and the example spec trains, registers and serves
through dag.test().
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from tests.support import REPO, edited_spec
from tests.trainer.helpers import Launch, binary_frame, committed_steps, kill_a_rank_after_a_commit, launch

pytestmark = [pytest.mark.integration, pytest.mark.slow]

EXAMPLE = REPO / "examples" / "acme_families"
FAMILY = "acme_two_tower"
# binary_frame's label follows f_small, f_large and f_offset; f_noise carries no signal.
USER_FEATURES = ["f_small", "f_large"]
ITEM_FEATURES = ["f_offset", "f_noise"]
# 600 rows, 32 a rank's batch, 2 ranks: 9 steps an epoch (18 in all), a commit every 4.
EPOCHS = 2
CHECKPOINT_EVERY = 4
PARAMS = {"user_features": USER_FEATURES, "item_features": ITEM_FEATURES, "embedding_dim": 8, "tower_hidden": 16}


@dataclass(frozen=True)
class Wheel:
    path: Path
    sha256: str


@dataclass(frozen=True)
class Installed:
    site: Path
    wheel: Wheel


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Wheel:
    """Built as the README says, offline: hatchling from the environment, not a fetched one."""
    dist = tmp_path_factory.mktemp("acme_dist")
    built = subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(dist),
                            str(EXAMPLE)], capture_output=True, text=True, timeout=300, check=False)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    (path,) = dist.glob("acme_trainpipe_families-0.1.0-*.whl")
    return Wheel(path=path, sha256=hashlib.sha256(path.read_bytes()).hexdigest())


@pytest.fixture(scope="module")
def acme_installed(wheel: Wheel, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    """The wheel installed into a folder of its own, on PYTHONPATH (torchrun's ranks, Airflow's task processes and
    `mlflow models serve` inherit it) and on this process's sys.path, for the module's tests."""
    site = tmp_path_factory.mktemp("acme_site")
    installed = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--target",
                                str(site), str(wheel.path)], capture_output=True, text=True, timeout=300, check=False)
    assert installed.returncode == 0, installed.stdout[-3000:] + installed.stderr[-3000:]
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])))
        patch.syspath_prepend(str(site))
        yield Installed(site=site, wheel=wheel)


def test_the_wheel_declares_only_the_trainer_and_registers_the_family(wheel: Wheel) -> None:
    with zipfile.ZipFile(wheel.path) as archive:
        names = archive.namelist()
        metadata = archive.read("acme_trainpipe_families-0.1.0.dist-info/METADATA").decode()
        entry_points = archive.read("acme_trainpipe_families-0.1.0.dist-info/entry_points.txt").decode()
    assert {"acme_families/__init__.py", "acme_families/two_tower.py", "acme_families/network.py"} <= set(names)
    # torch comes from the image or the worker (CPU or CUDA build), never from this package's requirements.
    assert [line for line in metadata.splitlines() if line.startswith("Requires-Dist:")] == [
        "Requires-Dist: trainpipe-trainer"]
    assert "[trainpipe.models]\nacme_two_tower = acme_families.two_tower:TwoTowerFamily" in entry_points


def test_the_installed_family_is_found_by_name_and_its_provenance_is_the_wheel(acme_installed: Installed) -> None:
    from trainpipe_trainer.models import family_provenance, load_family

    family = load_family(FAMILY)
    assert type(family).__module__ == "acme_families.two_tower"
    assert Path(sys.modules["acme_families"].__file__).is_relative_to(acme_installed.site)
    # pip records the wheel's hash (direct_url.json's archive_info), so the provenance is the file's sha256.
    assert family_provenance(FAMILY) == {"family": FAMILY, "distribution": "acme-trainpipe-families",
                                         "version": "0.1.0", "sha256": acme_installed.wheel.sha256}


VALID = {"user_features": ["a", "b"], "item_features": ["c"]}


def test_params_get_their_defaults(acme_installed: Installed) -> None:
    from trainpipe_trainer.models import load_family

    assert load_family(FAMILY).validate_params(VALID) == {**VALID, "embedding_dim": 16, "tower_hidden": 32}


@pytest.mark.parametrize(("params", "located"), [
    ({**VALID, "embeding_dim": 8}, r"model\.params\.embeding_dim: acme_two_tower has no such parameter; did you mean "
                                   r"`embedding_dim`\?"),
    ({"item_features": ["c"]}, r"model\.params\.user_features: required"),
    ({**VALID, "user_features": "a"}, r"model\.params\.user_features: must be a non-empty list of feature names"),
    ({**VALID, "user_features": []}, r"model\.params\.user_features: must be a non-empty list"),
    ({**VALID, "user_features": ["a", 3]}, r"model\.params\.user_features\[1\]: must be a feature name, got 3"),
    ({**VALID, "user_features": ["a", "a"]}, r"model\.params\.user_features\[1\]: 'a' is listed twice"),
    ({**VALID, "item_features": ["c", "b"]}, r"model\.params\.item_features\[1\]: 'b' is also in user_features"),
    ({**VALID, "embedding_dim": 0}, r"model\.params\.embedding_dim: must be between 1 and 1024, got 0"),
    ({**VALID, "tower_hidden": 5000}, r"model\.params\.tower_hidden: must be between 1 and 4096, got 5000"),
    ({**VALID, "tower_hidden": 8.0}, r"model\.params\.tower_hidden: must be a whole number, got 8\.0"),
    ({**VALID, "embedding_dim": True}, r"model\.params\.embedding_dim: must be a whole number, got True"),
])
def test_a_wrong_param_is_refused_at_its_path(acme_installed: Installed, params: dict, located: str) -> None:
    from trainpipe_trainer.models import FamilyParamsError, load_family

    with pytest.raises(FamilyParamsError, match=located):
        load_family(FAMILY).validate_params(params)


def _description(task: str = "binary_classification", classes: tuple[str, ...] = ()) -> Any:
    from trainpipe_trainer.models import DataDescription

    # b is categorical: two inputs come from it.
    return DataDescription(task=task, input_names=("a", "b=x", "b=y", "c"), input_features=("a", "b", "b", "c"),
                           classes=classes)


def test_the_towers_read_their_own_inputs_and_score_any_leading_shape(acme_installed: Installed) -> None:
    import torch

    from trainpipe_trainer.config import ModelConfig
    from trainpipe_trainer.models import load_family

    family = load_family(FAMILY)
    module = family.build(ModelConfig(type=FAMILY), family.validate_params(VALID), _description())
    assert module.user_inputs.tolist() == [0, 1, 2] and module.item_inputs.tolist() == [3]
    # Ranking batches are [queries, documents, inputs].
    assert module(torch.zeros(5, 7, 4)).shape == (5, 7, 1)
    # The input positions are not weights: checkpoints and the weights hash hold only the towers and the bias.
    assert all(key.startswith(("user_tower.", "item_tower.", "bias")) for key in module.state_dict())
    # The item input reaches the score only through the item tower.
    rows = torch.randn(3, 4)
    changed = rows.clone()
    changed[:, 3] += 1.0
    with torch.no_grad():
        user, item = module.user_tower(rows[:, :3]), module.item_tower(changed[:, 3:])
        torch.testing.assert_close(module(changed), (user * item).sum(-1, keepdim=True) + module.bias)


def test_a_multiclass_task_or_a_feature_outside_the_towers_is_refused_before_training(
        acme_installed: Installed) -> None:
    from trainpipe_trainer.config import ModelConfig
    from trainpipe_trainer.errors import TrainerInputError
    from trainpipe_trainer.models import FamilyParamsError, load_family

    family = load_family(FAMILY)
    params = family.validate_params(VALID)
    with pytest.raises(TrainerInputError, match=r"training\.task: acme_two_tower gives one score per row .* cannot "
                                                r"train multiclass_classification \(3 outputs\)"):
        family.build(ModelConfig(type=FAMILY), params, _description("multiclass_classification", ("p", "q", "r")))
    with pytest.raises(FamilyParamsError, match=r"model\.params\.item_features\[0\]: 'd' is not one of "
                                                r"training\.features \(a, b, c\)"):
        family.build(ModelConfig(type=FAMILY), {**params, "item_features": ["d"]}, _description())
    with pytest.raises(FamilyParamsError, match=r"model\.params: training\.features 'c' feed neither tower"):
        family.build(ModelConfig(type=FAMILY), {**params, "item_features": ["b"], "user_features": ["a"]},
                     _description())


# -- trained by the harness, under torchrun with 2 CPU ranks -----------------------------------------------------


@dataclass(frozen=True)
class Data:
    train: Path
    holdout: pd.DataFrame
    tracking_uri: str


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Data:
    from mlflow import MlflowClient

    root = tmp_path_factory.mktemp("acme_data")
    rng = np.random.default_rng(1234)
    binary_frame(rng, 600).to_parquet(root / "train.parquet")
    tracking_uri = f"sqlite:///{root / 'mlflow.db'}"
    # An explicit artifact location keeps every artifact in tmp.
    MlflowClient(tracking_uri).create_experiment("acme", artifact_location=(root / "artifacts").as_uri())
    return Data(train=root / "train.parquet", holdout=binary_frame(rng, 300), tracking_uri=tracking_uri)


def _config(workdir: Path, data: Data, **overrides: Any) -> dict[str, Any]:
    """The trainer config the provider writes for a spec naming the family (tests/trainer/conftest.py's shape)."""
    return {
        "pipeline_id": "acme-two-tower",
        "task": "binary_classification",
        "train_data_uri": str(data.train),
        "features": USER_FEATURES + ITEM_FEATURES,
        "label": "label",
        "model": {"type": FAMILY, "params": PARAMS},
        "epochs": EPOCHS,
        "batch_size": 32,
        "learning_rate": 0.01,
        "seed": 0,
        "checkpoint": {"root_uri": (workdir / "checkpoints").as_uri(), "every_n_steps": CHECKPOINT_EVERY,
                       "keep_last": 2},
        "tracking": {"tracking_uri": data.tracking_uri, "experiment_name": "acme", "log_every_n_steps": 2},
        "output_uri": str(workdir / "output"),
        "tags": {"dag_id": "acme_tests"},
        **overrides,
    }


def _ok(run: Launch) -> dict[str, Any]:
    assert run.returncode == 0, run.describe()
    return run.result()


def _resumes_to(reference: Launch, config: dict[str, Any], workdir: Path) -> None:
    """Rank 1 SIGKILLed after a commit; the rerun resumes from the last commit and ends on ``reference``'s
    weights, bit for bit."""
    killed = kill_a_rank_after_a_commit({**config, "fault_injection": {"step_delay_seconds": 0.2}}, workdir,
                                        commit_timeout=180)
    assert killed.returncode != 0
    assert not (workdir / "output" / "result.json").exists()
    resume_from = committed_steps(workdir / "checkpoints")[-1]
    assert CHECKPOINT_EVERY <= resume_from < EPOCHS * 9

    rerun = launch(config, workdir, nproc=2)
    result = _ok(rerun)
    assert f"resumed from step {resume_from}" in rerun.stdout
    assert result["global_step"] == EPOCHS * 9
    assert result["weights_sha256"] == _ok(reference)["weights_sha256"]


@pytest.fixture(scope="module")
def ddp_run(acme_installed: Installed, data: Data, tmp_path_factory: pytest.TempPathFactory) -> Launch:
    """The uninterrupted reference: 2 ranks, DDP; it logs the served model."""
    workdir = tmp_path_factory.mktemp("acme_ddp")
    return launch(_config(workdir, data), workdir, nproc=2)


def test_a_rank_killed_after_a_commit_resumes_to_the_uninterrupted_weights(
        ddp_run: Launch, data: Data, tmp_path: Path) -> None:
    _resumes_to(ddp_run, _config(tmp_path, data), tmp_path)


def test_the_logged_model_serves_probabilities_through_torch_with_the_family_as_a_requirement(
        ddp_run: Launch, data: Data, acme_installed: Installed, monkeypatch: pytest.MonkeyPatch) -> None:
    import mlflow
    from mlflow.tracking._tracking_service import utils

    # Undone at teardown: the process-wide URI would otherwise keep pointing here for the later tests.
    monkeypatch.setattr(utils, "_tracking_uri", utils._tracking_uri)
    mlflow.set_tracking_uri(data.tracking_uri)
    model_uri = _ok(ddp_run)["model_uri"]
    model = mlflow.pyfunc.load_model(model_uri)
    served = np.asarray(model.predict(data.holdout.drop(columns="label")))
    assert served.shape == (300,) and ((served > 0) & (served < 1)).all()
    accuracy = float(((served > 0.5) == data.holdout["label"].to_numpy().astype(bool)).mean())
    assert accuracy > 0.85, accuracy
    # Where the model is served, pip installs the family's exact release beside torch.
    logged = Path(mlflow.artifacts.download_artifacts(model_uri))
    assert "acme-trainpipe-families==0.1.0" in (logged / "requirements.txt").read_text().split()
    meta = json.loads((logged / "artifacts" / "model.json").read_text())
    assert meta["family"]["sha256"] == acme_installed.wheel.sha256
    assert meta["params"] == PARAMS


def test_deepspeed_zero2_resumes_a_killed_run_bit_identically(
        acme_installed: Installed, data: Data, tmp_path_factory: pytest.TempPathFactory) -> None:
    pytest.importorskip("deepspeed", reason="pip install 'trainpipe-trainer[deepspeed]'")
    settings = {"strategy": "deepspeed", "deepspeed": {"zero_stage": 2}}
    reference_dir = tmp_path_factory.mktemp("acme_zero2")
    reference = launch(_config(reference_dir, data, **settings), reference_dir, nproc=2)
    workdir = tmp_path_factory.mktemp("acme_zero2_killed")
    _resumes_to(reference, _config(workdir, data, **settings), workdir)


# -- the example spec through dag.test() -------------------------------------------------------------------------

END = datetime(2026, 10, 1, tzinfo=UTC)
PIPELINE = "fraud_two_tower"


@pytest.fixture(scope="module")
def configs(acme_installed: Installed, state_dir: Path, airflow_db: Path,
            tmp_path_factory: pytest.TempPathFactory) -> Path:
    from trainpipe.demo.synthetic import generate_transactions

    data = state_dir / "storage" / "acme" / "transactions.parquet"
    data.parent.mkdir(parents=True, exist_ok=True)
    generate_transactions(rows=8000, end=END).to_parquet(data, index=False)
    text = edited_spec(EXAMPLE / "fraud_two_tower.yaml", (
        ("uri: demo/transactions/transactions.parquet", "uri: acme/transactions.parquet"), ("retries: 1", "retries: 0")))
    folder = tmp_path_factory.mktemp("acme_configs")
    (folder / f"{PIPELINE}.yaml").write_text(text)
    return folder


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _served_by_mlflow_models_serve(model_uri: str, rows: pd.DataFrame, workdir: Path) -> list[float]:
    """``mlflow models serve`` of ``model_uri`` on 127.0.0.1 (the environment's PYTHONPATH reaches it), asked once."""
    port = _free_port()
    log = workdir / "serve.log"
    bin_dir = Path(sys.executable).parent
    # As from an activated environment: mlflow execs the scoring server (uvicorn) by name.
    env = {**os.environ, "PATH": os.pathsep.join([str(bin_dir), os.environ.get("PATH", "")])}
    with open(log, "w") as output:
        server = subprocess.Popen(
            [str(bin_dir / "mlflow"), "models", "serve", "-m", model_uri, "--env-manager", "local", "--host",
             "127.0.0.1", "-p", str(port)], cwd=workdir, env=env, stdout=output, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert server.poll() is None, log.read_text()[-4000:]
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=2).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "mlflow models serve did not answer /ping:\n" + log.read_text()
                time.sleep(0.5)
        body = json.dumps({"dataframe_split": json.loads(rows.to_json(orient="split", index=False))}).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{port}/invocations", data=body,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as answer:
            return json.loads(answer.read())["predictions"]
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_the_example_spec_trains_registers_and_serves_through_dag_test(
        configs: Path, acme_installed: Installed, state_dir: Path, monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> None:
    import mlflow
    from sklearn.metrics import roc_auc_score

    from tests.support import load_dag, run_dag

    dag_run, states = run_dag(load_dag(configs, PIPELINE, monkeypatch), logical_date=END)
    assert dag_run.state == "success" and states["promote"] == "success", states
    client = mlflow.MlflowClient(tracking_uri=os.environ["MLFLOW_TRACKING_URI"])
    version = client.get_model_version_by_alias(PIPELINE, "champion")
    assert int(version.version) == 1
    # Which family, from which wheel, trained the version: what `trainpipe reproduce` compares.
    assert {key: value for key, value in version.tags.items() if key.startswith("trainpipe.model_family")} == {
        "trainpipe.model_family": FAMILY, "trainpipe.model_family_distribution": "acme-trainpipe-families",
        "trainpipe.model_family_version": "0.1.0", "trainpipe.model_family_sha256": acme_installed.wheel.sha256}

    # The champion answers a fraud probability for raw rows (the spec's features, nothing encoded).
    frame = pd.read_parquet(state_dir / "storage" / "acme" / "transactions.parquet").tail(500)
    rows = frame.drop(columns=["transaction_id", "event_time", "region", "is_fraud"])
    served = np.asarray(mlflow.pyfunc.load_model(f"models:/{PIPELINE}@champion").predict(rows))
    assert served.shape == (500,) and ((served > 0) & (served < 1)).all()
    assert roc_auc_score(frame["is_fraud"], served) > 0.8

    # And the scoring server gives the same answer for the same rows.
    over_http = _served_by_mlflow_models_serve(f"models:/{PIPELINE}@champion", rows.head(5), tmp_path)
    np.testing.assert_allclose(over_http, served[:5], rtol=1e-6)
