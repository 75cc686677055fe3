"""Params, data-aware schedules and emitted Assets as compiled into the Airflow DAG."""

from __future__ import annotations

import pytest

from tests.support import REPO, spec_with
from trainpipe.compile.compiler import compile_file
from trainpipe.dags.builder import build_dag
from trainpipe.plan.model import model_asset_uri, snapshot_asset_uri
from trainpipe.plan.params import apply_run_params
from trainpipe.settings import Settings


def test_asset_scheduled_spec_runs_on_that_asset(tmp_path):
    from airflow.sdk import Asset

    spec = spec_with(tmp_path, 'schedule: "@daily"', "schedule:\n  assets: [trainpipe://transactions_ingest/snapshot]")
    dag = build_dag(compile_file(spec, settings=Settings.from_env()))

    assert list(dag.timetable.asset_condition.objects) == [Asset("trainpipe://transactions_ingest/snapshot")]


def test_pipeline_emits_snapshot_and_model_assets():
    from airflow.sdk import Asset

    dag = build_dag(compile_file(REPO / "dag_configs" / "fraud_detector.yaml", settings=Settings.from_env()))

    assert dag.get_task("snapshot").outlets == [Asset(snapshot_asset_uri("fraud_detector"))]
    # The model asset follows the champion: it is updated where the production alias moves.
    assert dag.get_task("promote").outlets == [Asset(model_asset_uri("fraud_detector"))]
    assert dag.get_task("register").outlets == []


def test_spec_params_become_airflow_params_with_spec_defaults():
    dag = build_dag(compile_file(REPO / "dag_configs" / "fraud_detector.yaml", settings=Settings.from_env()))

    params = dag.params
    assert set(params.keys()) == {"learning_rate", "epochs", "seed"}
    assert params["learning_rate"] == 0.003 and params["epochs"] == 8 and params["seed"] == 42
    schema = params.get_param("learning_rate").schema
    assert schema["type"] == "number" and schema["minimum"] == 0.00001 and schema["maximum"] == 0.1


def test_param_override_changes_only_that_run():
    plan = compile_file(REPO / "dag_configs" / "fraud_detector.yaml", settings=Settings.from_env())
    run, changed = apply_run_params(plan, {"learning_rate": 0.01, "epochs": 8})
    assert changed == {"learning_rate": 0.01}
    assert run.trainer.learning_rate == 0.01
    assert plan.trainer.learning_rate == 0.003


def test_params_survive_serialization_and_reach_every_task_at_run_time():
    """Params are attached after the tasks are built (ADR 0006): the stored DAG must still carry them,
    and each task must see them, with a trigger's overrides, exactly as Airflow merges them at run time."""
    from airflow.sdk.definitions.param import ParamValidationError, process_params
    from airflow.serialization.serialized_objects import DagSerialization

    dag = build_dag(compile_file(REPO / "dag_configs" / "fraud_detector.yaml", settings=Settings.from_env()))

    stored = DagSerialization.from_dict(DagSerialization.to_dict(dag))
    assert stored.params["learning_rate"] == 0.003
    assert stored.params.get_param("learning_rate").schema["maximum"] == 0.1
    for task in dag.tasks:
        assert process_params(dag, task, {"epochs": 3}, suppress_exception=False) == {
            "learning_rate": 0.003, "epochs": 3, "seed": 42}
    with pytest.raises(ParamValidationError, match="epochs"):
        process_params(dag, dag.get_task("train"), {"epochs": 0}, suppress_exception=False)


def test_trigger_form_refuses_what_the_run_would_refuse():
    """Bounds of the hyperparameter's own field apply to a run's value, declared or not: seed has no
    declared minimum but training.seed must be >= 0; learning_rate must stay > 0 and <= its maximum."""
    from airflow.sdk.definitions.param import ParamValidationError, process_params

    dag = build_dag(compile_file(REPO / "dag_configs" / "fraud_detector.yaml", settings=Settings.from_env()))
    train = dag.get_task("train")
    for bad in ({"seed": -1}, {"seed": 2**63}, {"learning_rate": 0.5}, {"epochs": 0}, {"epochs": 2.5},
                {"epochs": 100_001}):
        with pytest.raises(ParamValidationError, match=next(iter(bad))):
            process_params(dag, train, bad, suppress_exception=False)
    # The field's ceiling too (torch takes a 64-bit seed): the form refuses what the run would.
    assert dict(dag.params.get_param("seed").schema) == {"type": "integer", "minimum": 0, "maximum": 2**63 - 1}


@pytest.mark.parametrize("spec_file", sorted((REPO / "dag_configs").glob("*.yaml")), ids=lambda p: p.stem)
def test_every_example_dag_passes_airflows_own_param_check(spec_file):
    dag = build_dag(compile_file(spec_file, settings=Settings.from_env()))
    dag.params.validate()  # what DAG() would run if the params were passed to it


_PARAM_CASES = [
    # (param name, spec value at its path, param mapping in YAML)
    ("epochs", 8, {}),
    ("epochs", 8, {"minimum": 1, "maximum": 8}),
    ("epochs", 8, {"minimum": 9}),
    ("epochs", 8, {"maximum": 7}),
    ("epochs", 8, {"default": 12, "maximum": 10}),
    ("epochs", 8, {"default": 2.5}),
    ("epochs", 8, {"default": 3.0}),
    ("epochs", 8, {"minimum": 5, "maximum": 4}),
    ("learning_rate", 0.003, {"minimum": 0.003}),
    ("learning_rate", 0.003, {"minimum": 0.0031}),
    ("learning_rate", 0.003, {"maximum": 0.0029}),
    ("learning_rate", 0.003, {"default": 0.5, "minimum": 0.0001, "maximum": 1}),
    ("learning_rate", 0.003, {"default": 0, "minimum": 0.0001}),
    ("seed", 42, {"minimum": 0, "maximum": 41}),
    ("dropout", 0.0, {"maximum": 0.5}),
    ("dropout", 0.0, {"minimum": 0.1}),
    ("decision_threshold", 0.3, {"minimum": 0.0, "maximum": 1.0}),
    ("decision_threshold", 0.3, {"default": 1.5, "maximum": 1.0}),
    ("gradient_clip_norm", None, {"minimum": 1.0}),
    # the field's own constraints bound the Param too
    ("learning_rate", 0.003, {"default": 0}),
    ("epochs", 8, {"minimum": 0}),
    ("epochs", 8, {"default": 0, "minimum": 0}),
    ("dropout", 0.0, {"default": 1.0}),
    ("decision_threshold", 0.3, {"default": 1.0}),
    ("decision_threshold", 0.3, {"default": 0.99, "maximum": 1.0}),
]


@pytest.mark.parametrize(("name", "spec_value", "param"), _PARAM_CASES)
def test_spec_check_accepts_exactly_the_params_airflow_accepts(name, spec_value, param):
    """The spec stage's param check stands in for Airflow's own (ADR 0006), so they must agree:
    a spec is rejected at validation exactly when Airflow would reject the compiled Param."""
    import yaml
    from airflow.sdk import Param
    from airflow.sdk.definitions.param import ParamValidationError

    from trainpipe.errors import SpecError
    from trainpipe.plan.build import build_plan
    from trainpipe.spec.loader import load_yaml_text
    from trainpipe.spec.sections.params import OVERRIDABLE_PARAMS, ParamSpec
    from trainpipe.spec.sections.pipeline import param_bounds
    from trainpipe.spec.validate import validate_loaded

    data = yaml.safe_load((REPO / "dag_configs" / "fraud_detector.yaml").read_text())
    path, json_type = OVERRIDABLE_PARAMS[name]
    node = data
    for part in path[:-1]:
        node = node.setdefault(part, {})
    if spec_value is None:
        node.pop(path[-1], None)
    else:
        node[path[-1]] = spec_value
    data["params"] = {name: param}
    text = yaml.safe_dump(data)

    try:
        spec = validate_loaded(load_yaml_text(text, "case.yaml"))
    except SpecError as err:
        ours_accepts, our_message = False, str(err)
    else:
        ours_accepts, our_message = True, ""

    default = param.get("default", spec_value)
    bounds = {b.keyword: b.value for b in param_bounds(name, ParamSpec(**param))}
    try:
        Param(default, type=[json_type, "null"] if default is None else json_type, **bounds).resolve()
        airflow_accepts = True
    except ParamValidationError:
        airflow_accepts = False
    if param.get("minimum", float("-inf")) > param.get("maximum", float("inf")):
        airflow_accepts = False  # an empty range accepts no value a run could give

    assert ours_accepts == airflow_accepts, our_message
    if ours_accepts:
        built = build_dag(build_plan(spec, spec_file="case.yaml", spec_text=text))
        built.params.validate()
    else:
        assert f"params.{name}" in our_message


def test_airflow_config_defaults_still_apply(monkeypatch):
    """build_dag passes Airflow's config defaults explicitly (read once per process): they must be the
    configured values, not constants."""
    from trainpipe.dags import builder as dag_builder

    monkeypatch.setenv("AIRFLOW__CORE__MAX_ACTIVE_TASKS_PER_DAG", "3")
    monkeypatch.setenv("AIRFLOW__SENSORS__DEFAULT_TIMEOUT", "1234")
    dag_builder._airflow_config_defaults.cache_clear()
    try:
        dag = build_dag(compile_file(REPO / "dag_configs" / "fraud_detector.yaml", settings=Settings.from_env()))
    finally:
        dag_builder._airflow_config_defaults.cache_clear()
    assert dag.max_active_tasks == 3
    assert dag.get_task("watch_checkpoints").timeout == 1234


@pytest.mark.parametrize(("uri", "why"), [
    ("airflow://x", "Asset scheme 'airflow' is reserved"),
    ("s3://", "must contain a bucket name"),
    ("", "Asset name cannot be empty"),
])
def test_an_asset_uri_airflow_refuses_is_an_import_error_of_its_spec_at_its_item_and_the_others_load(
        tmp_path, uri, why):
    """Airflow judges asset URIs when the DAG is built (the compile stages import no Airflow): its refusal is
    reported at the spec's line and item, not as a trainpipe bug at 1:1, and the other specs still load."""
    import shutil

    from trainpipe.dags.files import register_dags

    configs = tmp_path / "dag_configs"
    configs.mkdir()
    shutil.copy(REPO / "dag_configs" / "fraud_detector.yaml", configs)
    spec_with(configs, 'schedule: "@daily"', f"schedule:\n  assets: [trainpipe://ok/snapshot, {uri!r}]",
              name="waits_on_asset.yaml")
    (configs / "waits_on_asset.yaml").write_text(
        (configs / "waits_on_asset.yaml").read_text().replace("pipeline_id: fraud_detector", "pipeline_id: waits"))
    namespace: dict = {}
    result = register_dags(namespace, configs, settings=Settings.from_env())

    assert set(namespace) == {"fraud_detector"}
    (error,) = result.errors.values()
    (problem,) = error.problems
    assert problem.field_path == "schedule.assets[1]" and problem.line > 1, problem
    assert why in problem.message and "trainpipe bug" not in problem.message


def test_the_deadline_alert_name_fits_airflows_column_for_the_longest_pipeline_id(tmp_path):
    from airflow.models.deadline_alert import DeadlineAlert as DeadlineAlertRow

    from trainpipe.dags.builder import DEADLINE_NAME_MAX_LENGTH

    assert DeadlineAlertRow.__table__.c.name.type.length == DEADLINE_NAME_MAX_LENGTH
    long_id = "p" * 250
    spec = spec_with(tmp_path, "pipeline_id: fraud_detector_approval",
                     f"pipeline_id: {long_id}\n", example="fraud_detector_approval.yaml")
    spec.write_text(spec.read_text().replace("  email:", "  deadline: {within: 6h}\n  email:", 1))
    dag = build_dag(compile_file(spec, settings=Settings.from_env()))

    assert len(dag.deadline[0].name if isinstance(dag.deadline, list) else dag.deadline.name) <= 250


def test_the_dag_docs_show_the_description_as_written_not_as_markdown(tmp_path):
    """The Airflow UI renders a DAG's docs as Markdown: a spec's description made a heading, a link showing
    other text than its address, and a remote image (red team, round 4). Each is text now."""
    import yaml

    spec = yaml.safe_load((REPO / "dag_configs" / "fraud_detector.yaml").read_text())
    spec["description"] = "# Approved by the platform team\n[Re-approve here](https://evil.example) ![](https://t.example/p.png)"
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    doc = build_dag(compile_file(path, settings=Settings.from_env())).doc_md
    rendered = markdown_html(doc)
    assert "<h1>" not in rendered and "<a " not in rendered and "<img" not in rendered
    assert "# Approved by the platform team" in rendered and "[Re-approve here](https://evil.example)" in rendered


def markdown_html(text: str) -> str:
    """Markdown as a GFM renderer shows it (bare URLs linked, like the Airflow UI's react-markdown + remark-gfm)."""
    from markdown_it import MarkdownIt

    return MarkdownIt("gfm-like").render(text)
