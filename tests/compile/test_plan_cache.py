"""The compiled-plan cache (ADR 0012): unchanged specs are not compiled again, a cached DAG is the DAG
Airflow would have built, and a corrupt, foreign or stale cache is ignored, never fatal."""

from __future__ import annotations

import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import trainpipe.plan.build
import trainpipe.spec.sections.pipeline
from tests.support import REPO
from trainpipe.compile.compiler import compile_directory
from trainpipe.compile.plan_cache import PlanCache, _package_sources, code_fingerprint
from trainpipe.dags.files import register_dags
from trainpipe.settings import Settings


@pytest.fixture
def configs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "dag_configs"
    shutil.copytree(REPO / "dag_configs", folder)
    monkeypatch.setenv("TRAINPIPE_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("_AIRFLOW_PARSING_CONTEXT_DAG_ID", raising=False)
    return folder


def _bundle(tmp_path: Path) -> Path:
    (bundle,) = (tmp_path / "home" / "cache" / "plans").glob("*/*.pickle")
    return bundle


def _serialized(dags: dict) -> dict:
    from airflow.serialization.serialized_objects import DagSerialization

    return {dag_id: DagSerialization.to_dict(dag) for dag_id, dag in sorted(dags.items())}


def test_a_warm_parse_compiles_nothing_and_builds_the_same_dags(configs: Path, tmp_path: Path):
    cold: dict = {}
    first = register_dags(cold, configs, settings=Settings.from_env())
    warm: dict = {}
    second = register_dags(warm, configs, settings=Settings.from_env())

    assert first.cached == set() and len(first.plans) >= 4
    assert second.cached == set(first.files)
    assert second.plans == first.plans
    # What Airflow stores of each DAG: identical whether it was built or came from the cache.
    assert _serialized(warm) == _serialized(cold)
    assert _bundle(tmp_path).stat().st_mode & 0o077 == 0
    assert _bundle(tmp_path).parent.stat().st_mode & 0o077 == 0


def test_a_changed_spec_or_defaults_file_is_compiled_again(configs: Path):
    register_dags({}, configs, settings=Settings.from_env())
    spec = configs / "fraud_detector.yaml"
    spec.write_text(spec.read_text().replace("  epochs: 8", "  epochs: 9").replace("owner: risk-ml\n", ""))

    result = register_dags({}, configs, settings=Settings.from_env())

    assert "dag_configs/fraud_detector.yaml" not in result.cached
    assert result.plans["fraud_detector"].trainer.epochs == 9
    assert len(result.cached) == len(result.files) - 1

    (configs / "_defaults.yaml").write_text("owner: platform-team\n")
    result = register_dags({}, configs, settings=Settings.from_env())
    assert result.cached == set()
    assert result.plans["fraud_detector"].owner == "platform-team"


def test_a_warm_parse_neither_validates_nor_imports_the_spec_models(configs: Path, tmp_path: Path):
    # What makes a warm parse cheap: plans and DAGs come out of the cache without the validator and its
    # pydantic models (most of a small shard's import time), in a fresh process as Airflow parses.
    code = ("import sys; from pathlib import Path; from trainpipe.dags.files import register_dags; "
            "from trainpipe.settings import Settings; dags = {}; "
            f"result = register_dags(dags, Path({str(configs)!r}), settings=Settings.from_env()); "
            "print(len(dags), len(result.cached), len(result.errors), "
            "sorted(m for m in ('trainpipe.spec.sections.pipeline', 'trainpipe.spec.validate') if m in sys.modules))")
    env = {**os.environ, "TRAINPIPE_HOME": str(tmp_path / "home")}
    cold = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True, timeout=180)
    warm = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True, timeout=180)

    count = len(compile_directory(configs, relative_to=configs.parent, settings=Settings.from_env()).plans)
    # The last line is the print (Airflow's log may write to stdout before it).
    assert cold.stdout.splitlines()[-1].split() == [
        str(count), "0", "0", "['trainpipe.spec.sections.pipeline',", "'trainpipe.spec.validate']"]
    assert warm.stdout.splitlines()[-1].split() == [str(count), str(count), "0", "[]"]


def test_the_fingerprint_covers_the_plan_and_spec_sources():
    # Editing the plan or the spec models without bumping the version must not reuse old plans.
    sources = _package_sources()
    assert Path(trainpipe.plan.build.__file__).resolve() in sources
    assert Path(trainpipe.spec.sections.pipeline.__file__).resolve() in sources
    assert len(code_fingerprint()) == 64


def test_the_fingerprint_covers_the_built_in_families_params_checks():
    """Spec validation runs them (text_bag's, the transformer's): a tightened check must not reuse old plans."""
    import trainpipe_trainer.models.text_bag.params
    import trainpipe_trainer.models.transformer.params

    sources = _package_sources()
    for module in (trainpipe_trainer.models.text_bag.params, trainpipe_trainer.models.transformer.params):
        assert Path(module.__file__).resolve() in sources
        assert Path(module.__file__).resolve().is_file()


def _corrupt_garbage(bundle: Path) -> None:
    bundle.write_bytes(os.urandom(4096))


def _corrupt_truncated(bundle: Path) -> None:
    bundle.write_bytes(bundle.read_bytes()[: bundle.stat().st_size // 2])


def _corrupt_other_code(bundle: Path) -> None:
    data = bundle.read_bytes()
    header = b"trainpipe-plan-cache\n"
    bundle.write_bytes(header + b"0" * 64 + data[len(header) + 64:])


def _corrupt_swapped_entries(bundle: Path) -> None:
    """A well-formed bundle whose entries hold other specs' plans and DAGs."""
    data = bundle.read_bytes()
    prefix = len(b"trainpipe-plan-cache\n") + 64
    entries = pickle.loads(data[prefix:])
    keys = sorted(entries)
    swapped = {key: entries[keys[(i + 1) % len(keys)]] for i, key in enumerate(keys)}
    bundle.write_bytes(data[:prefix] + pickle.dumps(swapped))


def _corrupt_entry_bytes(bundle: Path) -> None:
    data = bundle.read_bytes()
    prefix = len(b"trainpipe-plan-cache\n") + 64
    entries = pickle.loads(data[prefix:])
    damaged = {key: (*entry[:3], entry[3][:50]) for key, entry in entries.items()}
    bundle.write_bytes(data[:prefix] + pickle.dumps(damaged))


def _corrupt_writable_by_others(bundle: Path) -> None:
    bundle.chmod(0o666)


@pytest.mark.parametrize("corrupt", [_corrupt_garbage, _corrupt_truncated, _corrupt_other_code,
                                     _corrupt_swapped_entries, _corrupt_entry_bytes, _corrupt_writable_by_others])
def test_a_corrupted_cache_still_compiles_the_folder_correctly(configs: Path, tmp_path: Path, corrupt):
    fresh = compile_directory(configs, relative_to=configs.parent, settings=Settings.from_env())
    cold: dict = {}
    register_dags(cold, configs, settings=Settings.from_env())
    corrupt(_bundle(tmp_path))

    dags: dict = {}
    result = register_dags(dags, configs, settings=Settings.from_env())

    assert result.errors == {}
    assert result.plans == fresh.plans
    assert {dag_id: plan.spec_file for dag_id, plan in result.plans.items()} == {
        dag_id: plan.spec_file for dag_id, plan in fresh.plans.items()}
    assert _serialized(dags) == _serialized(cold)
    # The bad bundle was replaced by a good one: the next parse hits again.
    assert register_dags({}, configs, settings=Settings.from_env()).cached == set(result.files)


def test_a_cache_that_cannot_be_written_is_not_fatal(configs: Path, tmp_path: Path):
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "cache").write_text("a file where the cache folder would be")

    dags: dict = {}
    result = register_dags(dags, configs, settings=Settings.from_env())

    assert result.errors == {} and set(dags) == set(result.plans) and len(dags) >= 4


def test_bundles_are_per_configs_folder_and_shard(tmp_path: Path):
    one = PlanCache(tmp_path / "a", "shard01", home=tmp_path)
    assert one.path != PlanCache(tmp_path / "b", "shard01", home=tmp_path).path
    assert one.path != PlanCache(tmp_path / "a", "shard02", home=tmp_path).path
    assert one.path.parent.name == code_fingerprint()[:32]


def test_the_pipeline_id_index_follows_edits_and_survives_a_damaged_index(tmp_path: Path):
    from trainpipe.dags.files import declared_pipeline_id

    files = []
    for i in range(3):
        files.append(tmp_path / f"p{i}.yaml")
        files[-1].write_text(f"pipeline_id: p{i}\n")
    paths = [str(path) for path in files]
    cache = PlanCache(tmp_path, "shard01", home=tmp_path / "home")
    assert cache.declared_ids(paths, declared_pipeline_id) == {paths[0]: "p0", paths[1]: "p1", paths[2]: "p2"}

    files[1].write_text("pipeline_id: renamed\n")  # edited in place: its size and times change
    files[2].unlink()
    assert cache.declared_ids(paths, declared_pipeline_id) == {paths[0]: "p0", paths[1]: "renamed"}

    # An index of the wrong shape (written by a bug, or by hand) is ignored: every file is read again.
    with cache.ids_path.open("r+b") as handle:
        handle.seek(len(b"trainpipe-plan-cache\n") + 64)
        handle.truncate()
        pickle.dump({paths[0]: ("wrong",), paths[1]: 7}, handle)
    assert cache.declared_ids(paths, declared_pipeline_id) == {paths[0]: "p0", paths[1]: "renamed"}
    assert cache.declared_ids(paths, lambda path: "never read") == {paths[0]: "p0", paths[1]: "renamed"}
