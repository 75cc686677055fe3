"""A spec's expectation arguments never become code, a query or a request on the worker.

Each payload below would create a file when Great Expectations evaluates it (the control test runs
it through GE directly and sees the file appear). Through trainpipe, the spec stage refuses it with
a located error, and the validate task's code (``trainpipe.steps.validate.quality``, ``steps.validate.validate``) refuses
it again when a plan skipped the spec stage: the file never exists.
"""

from __future__ import annotations

import dataclasses
import http.server
import threading
import warnings
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd
import pytest

from trainpipe.errors import SpecError
from trainpipe.plan.build import build_plan
from trainpipe.settings import Settings
from trainpipe.spec import expectations
from trainpipe.spec.loader import load_yaml_text
from trainpipe.spec.validate import validate_loaded
from trainpipe.steps.snapshot import take_snapshot
from trainpipe.steps.validate.quality import validate_dataframe
from trainpipe.steps.validate.validate import validate_snapshot

# Items of validation.expectations start on line 14.
BASE = """\
pipeline_id: p
data:
  uri: demo/p/data.parquet
training:
  task: binary_classification
  features: [amount]
  label: is_fraud
evaluation:
  metrics: [auc]
registration:
  model_name: m
validation:
  expectations:
"""
RCE = "@pd.io.common.os.system('touch {marker}')"


def _payloads(marker: Path) -> dict[str, tuple[dict, str]]:
    """name -> (kwargs of expect_column_values_to_not_be_null, the argument path the error names)."""
    code = RCE.format(marker=marker)
    breakout = f"amount` > 0 or {code} > 0 or `amount"  # a backtick ends pandas' quoting of a column name
    return {
        "pandas_parser": ({"row_condition": code, "condition_parser": "pandas"}, "condition_parser"),
        "text_without_parser": ({"row_condition": code}, "row_condition"),
        "pass_through_mapping": ({"row_condition": {"type": "pass_through", "pass_through_filter": code}},
                                 "row_condition"),
        "ge_grammar_backtick": ({"row_condition": f'col("{breakout}") > 1', "condition_parser": "great_expectations"},
                                "row_condition"),
        "mapping_backtick": ({"row_condition": {"type": "comparison", "column": {"name": breakout}, "operator": ">",
                                                "parameter": 1}}, "row_condition.column.name"),
        "nested_pass_through": ({"row_condition": {"type": "and", "conditions": [
            {"type": "nullity", "column": {"name": "amount"}, "is_null": False},
            {"type": "pass_through", "pass_through_filter": code}]}}, "row_condition.conditions[1]"),
    }


def _yaml(kwargs: dict) -> str:
    import json

    return f"expect_column_values_to_not_be_null: {json.dumps({'column': 'amount', **kwargs})}"


def _spec_problems(*items: str) -> list[str]:
    with pytest.raises(SpecError) as caught:
        validate_loaded(load_yaml_text(BASE + "".join(f"    - {item}\n" for item in items), "specs/x.yaml"))
    return [str(p) for p in caught.value.problems]


@pytest.fixture(autouse=True)
def _quiet_gx(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GX_ANALYTICS_ENABLED", "false")


FRAME = pd.DataFrame({"amount": [1.0, 2.0, 3.0], "is_fraud": [0, 1, 0]})


@pytest.mark.parametrize("payload", list(_payloads(Path("m"))))
def test_great_expectations_itself_runs_the_payload(payload: str, tmp_path: Path):
    """The control: each payload does create its file when GE evaluates it, so the absence of the
    file in the tests below is trainpipe's doing."""
    import great_expectations as gx

    marker = tmp_path / "created"
    kwargs, _ = _payloads(marker)[payload]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expectation = gx.expectations.ExpectColumnValuesToNotBeNull(column="amount", **kwargs)
    context = gx.get_context(mode="ephemeral")
    batch = (context.data_sources.add_pandas(name="t").add_dataframe_asset(name="a")
             .add_batch_definition_whole_dataframe("w").get_batch(batch_parameters={"dataframe": FRAME}))
    if payload == "nested_pass_through":
        # GE refuses a pass-through inside an AND at query time; its text alone reaches DataFrame.query.
        FRAME.query(kwargs["row_condition"]["conditions"][1]["pass_through_filter"])
    else:
        batch.validate(expectation)
    assert marker.exists()


@pytest.mark.parametrize("payload", list(_payloads(Path("m"))))
def test_spec_stage_refuses_the_payload_located(payload: str, tmp_path: Path):
    marker = tmp_path / "created"
    kwargs, at = _payloads(marker)[payload]

    problems = _spec_problems(_yaml(kwargs))

    assert any(p.startswith("specs/x.yaml:14:") and
               f"validation.expectations[0].expect_column_values_to_not_be_null.{at}: " in p for p in problems), problems
    assert any("Great Expectations' condition grammar" in p or "backtick" in p for p in problems), problems
    assert not marker.exists()


@pytest.mark.parametrize("payload", list(_payloads(Path("m"))))
def test_validate_task_code_refuses_the_payload_without_the_spec_stage(payload: str, tmp_path: Path):
    marker = tmp_path / "created"
    kwargs, at = _payloads(marker)[payload]

    with pytest.raises(SpecError, match=rf"validation\.expectations\[0\]: expect_column_values_to_not_be_null\."
                                        rf"{at.split('[')[0].split('.')[0]}"):
        validate_dataframe(FRAME, expectations=[("expect_column_values_to_not_be_null", {"column": "amount", **kwargs})],
                           required_columns=["amount"])
    assert not marker.exists()


def test_validate_snapshot_with_a_plan_that_skipped_the_spec_stage(tmp_path: Path):
    """The validate task's own entry point, on a real snapshot: a plan edited after the spec stage
    (a stale cache, a hand-made plan) still never evaluates the condition."""
    settings = Settings.from_env()
    text = BASE.replace("demo/p/", f"demo/{tmp_path.name}/") + "    - expect_column_values_to_not_be_null: {column: amount}\n"
    plan = build_plan(validate_loaded(load_yaml_text(text, "p.yaml")), spec_file="p.yaml", spec_text=text)
    data = Path(settings.storage_root.removeprefix("file://")) / plan.data.uri
    data.parent.mkdir(parents=True, exist_ok=True)
    FRAME.to_parquet(data, index=False)
    snapshot = take_snapshot(plan.dag_id, plan.data, settings=settings, dag_id=plan.dag_id, run_id="manual__1",
                             logical_date=datetime(2026, 6, 30, tzinfo=UTC))
    marker = tmp_path / "created"
    kwargs, _ = _payloads(marker)["pandas_parser"]
    tampered = dataclasses.replace(plan.validation, expectations=(
        ("expect_column_values_to_not_be_null", {"column": "amount", **kwargs}),))

    with pytest.raises(SpecError, match=r"condition_parser: 'pandas' hands the condition text to an evaluator"):
        validate_snapshot(plan.dag_id, tampered, snapshot, settings=settings, dag_id=plan.dag_id, run_id="manual__1")
    assert not marker.exists()


# ---------------------------------------------------------------------------------------------
# what stays allowed: Great Expectations' own conditions, as text or as a mapping


@pytest.mark.parametrize("condition", [
    {"row_condition": 'col("is_fraud") == 1', "condition_parser": "great_expectations"},
    {"row_condition": {"type": "comparison", "column": {"name": "is_fraud"}, "operator": "==", "parameter": 1}},
    {"row_condition": {"type": "and", "conditions": [
        {"type": "comparison", "column": {"name": "is_fraud"}, "operator": "IN", "parameter": [1]},
        {"type": "nullity", "column": {"name": "amount"}, "is_null": False}]}},
])
def test_great_expectations_conditions_pass_and_filter_rows(condition: dict):
    validate_loaded(load_yaml_text(BASE + f"    - {_yaml({'mostly': 1.0, **condition})}\n", "specs/x.yaml"))
    # amount == 2.0 exactly on the rows the condition keeps: only a filtered check passes.
    kwargs = {"column": "amount", "min_value": 2.0, "max_value": 2.0, **condition}
    report = validate_dataframe(FRAME, expectations=[("expect_column_values_to_be_between", kwargs)],
                                required_columns=[])
    assert report.success, report.summary()


PARSER_PROBES = ['col("a") > 1', 'col("a")>=-2.5e3', 'col("a") == "DE"', "col(\"a\") != 'x y'", 'col("a").notnull()',
                 'col("a").NOTNULL()', 'col("a b") < 3', 'col("a") == date("2024-01-01")', 'col("a") > 1 and junk',
                 'col(a) > 1', 'a > 1', 'col("a") ~ 1', 'col("a") == "it\'s"', '', 'col("a")']


@pytest.mark.parametrize("text", PARSER_PROBES)
def test_condition_grammar_agrees_with_great_expectations(text: str):
    """What trainpipe accepts GE parses whole to the same column; what GE cannot parse trainpipe refuses."""
    from great_expectations.expectations.legacy_row_conditions import (
        ConditionParserError,
        parse_great_expectations_condition,
    )

    ours = expectations._text_condition_problems(text)
    try:
        parsed = parse_great_expectations_condition(text)
    except ConditionParserError:
        assert ours, f"GE refuses {text!r}, trainpipe accepts it"
        return
    if not ours:
        assert expectations._GE_CONDITION.fullmatch(text.strip())["column"] == parsed["column"]
        assert parsed.as_list() and "junk" not in text


# ---------------------------------------------------------------------------------------------
# the other arguments that reach an evaluator


def test_suite_parameter_expressions_are_refused():
    # GE evaluates {$PARAMETER: ...} with its arithmetic parser: 9^9^9 would not finish.
    problems = _spec_problems('expect_column_values_to_be_between: {column: amount, min_value: {$PARAMETER: "9^9^9"}}')
    assert problems == ["specs/x.yaml:14:72: validation.expectations[0].expect_column_values_to_be_between.min_value."
                        "$PARAMETER: suite parameters are evaluated as expressions and trainpipe passes none, so this "
                        "could only fail or compute; write the value itself"]
    with pytest.raises(SpecError, match=r"min_value\.\$PARAMETER: suite parameters are evaluated"):
        validate_dataframe(FRAME, expectations=[("expect_column_values_to_be_between",
                                                 {"column": "amount", "min_value": {"$PARAMETER": "9^9^9"}})],
                           required_columns=[])


@pytest.mark.parametrize("name", sorted(expectations.REFUSED_EXPECTATIONS))
def test_expectations_that_run_query_text_are_refused(name: str):
    required = {"unexpected_rows_expectation": "{unexpected_rows_query: 'SELECT * FROM {batch}'}",
                "expect_query_results_to_match_comparison": "{base_query: 'SELECT 1', comparison_query: 'SELECT 1', "
                                                            "comparison_data_source_name: other}",
                "expect_table_row_count_to_equal_other_table": "{other_table_name: other}"}[name]
    problems = _spec_problems(f"{name}: {required}")
    assert problems == [f"specs/x.yaml:14:7: validation.expectations[0]: {name} {expectations.REFUSED_EXPECTATIONS[name]}"]


def test_json_schema_refers_only_inside_itself(tmp_path: Path):
    """jsonschema fetches a remote $ref: refused at the spec stage and in the validate task, and no
    request reaches the server."""
    requests: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            requests.append(self.path)
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        remote = f"http://127.0.0.1:{server.server_port}/schema.json"
        problems = _spec_problems(
            "expect_column_values_to_match_json_schema: "
            f'{{column: doc, json_schema: {{properties: {{a: {{$ref: "{remote}"}}}}}}}}')
        assert problems == [f"specs/x.yaml:14:95: validation.expectations[0].expect_column_values_to_match_json_schema."
                            f"json_schema.properties.a.$ref: {remote!r} refers to another document, which jsonschema "
                            "would fetch (a request from the worker); refer only inside this schema (`#/$defs/...`)"]
        frame = pd.DataFrame({"doc": ['{"a": 1}']})
        with pytest.raises(SpecError, match=r"json_schema\.properties\.a\.\$ref: .* refers to another document"):
            validate_dataframe(frame, expectations=[("expect_column_values_to_match_json_schema",
                                                     {"column": "doc", "json_schema": {"properties": {"a": {"$ref": remote}}}})],
                               required_columns=[])
        local = {"$defs": {"n": {"type": "integer"}}, "properties": {"a": {"$ref": "#/$defs/n"}}}
        report = validate_dataframe(frame, expectations=[("expect_column_values_to_match_json_schema",
                                                          {"column": "doc", "json_schema": local})], required_columns=[])
        assert report.success, report.summary()
    finally:
        server.shutdown()
        server.server_close()
    assert requests == []
