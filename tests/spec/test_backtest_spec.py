"""registration.backtest (issue 33): defaults, the plan, and the alias a backtest may take (located errors; a
template is refused, never rendered)."""

from __future__ import annotations

import pytest

from tests.support import REPO
from trainpipe.errors import SpecError
from trainpipe.plan.build import build_plan
from trainpipe.plan.model import BacktestPlan
from trainpipe.spec.loader import load_yaml_text
from trainpipe.spec.validate import validate_loaded

FRAUD = (REPO / "dag_configs" / "fraud_detector.yaml").read_text()
ANCHOR = "  model_name: fraud_detector\n  alias: champion\n"


def _with_backtest(block: str) -> str:
    assert ANCHOR in FRAUD
    return FRAUD.replace(ANCHOR, ANCHOR + block)


def _messages(text: str) -> list[str]:
    with pytest.raises(SpecError) as caught:
        validate_loaded(load_yaml_text(text, "specs/x.yaml"))
    return [str(p) for p in caught.value.problems]


def _line_of(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


def test_by_default_a_backtest_registers_nothing_and_promotes_nothing():
    spec = validate_loaded(load_yaml_text(FRAUD, "specs/x.yaml"))
    backtest = build_plan(spec, spec_file="x.yaml", spec_text=FRAUD).registration.backtest
    assert backtest == BacktestPlan(register=False, alias=None, promote="deny")


def test_the_spec_reaches_the_plan():
    text = _with_backtest("  backtest: {register: true, alias: backtest_2026, promote: deny}\n")
    plan = build_plan(validate_loaded(load_yaml_text(text, "specs/x.yaml")), spec_file="x.yaml", spec_text=text)
    assert plan.registration.backtest == BacktestPlan(register=True, alias="backtest_2026", promote="deny")


@pytest.mark.parametrize("alias", ["champion", "challenger", "previous_champion"])
def test_a_lifecycle_alias_is_refused_with_its_line(alias):
    text = _with_backtest(f"  backtest: {{register: true, alias: {alias}}}\n")
    line = _line_of(text, "backtest:")
    [message] = _messages(text)
    assert message.startswith(f"specs/x.yaml:{line}:")
    assert f"registration.backtest.alias: {alias!r} is " in message
    assert "a backtest never takes a lifecycle alias, use a name of its own such as `backtest`" in message


@pytest.mark.parametrize(("alias", "role"), [("Champion", "alias"), ("CHALLENGER", "challenger_alias")])
def test_a_lifecycle_alias_in_other_case_is_refused_too(alias, role):
    """Unity Catalog, and MLflow on a case-insensitive database collation, take 'Champion' for 'champion':
    register would move the production alias of the team's model before any gate or approval."""
    [message] = _messages(_with_backtest(f"  backtest: {{register: true, alias: {alias}}}\n"))
    assert (f"registration.backtest.alias: {alias!r} is registration.{role} ({alias.lower()!r}: some registries "
            "ignore case)") in message
    [message] = _messages(_with_backtest("  previous_alias: Champion\n"))
    assert ("registration.previous_alias: 'Champion' is also registration.alias ('champion': some registries "
            "ignore case); the production, challenger and previous aliases must differ") in message


@pytest.mark.parametrize("alias", ["ch\u00e1mpion", "champ\u0131on", "ch\u0430mpion"], ids=["accent", "dotless-i", "cyrillic-a"])
def test_an_alias_is_ascii_so_no_look_alike_of_champion_passes(alias):
    """MySQL's default collation ignores accents as well as case: 'ch\u00e1mpion' is 'champion' there."""
    [message] = _messages(_with_backtest(f"  challenger_alias: {alias}\n"))
    assert "registration.challenger_alias: must start with a letter and use only ASCII letters" in message


def test_the_spec_s_own_lifecycle_alias_names_are_refused_too():
    text = _with_backtest("  challenger_alias: candidate\n  backtest: {register: true, alias: candidate}\n")
    [message] = _messages(text)
    assert "registration.backtest.alias: 'candidate' is registration.challenger_alias;" in message


def test_an_alias_without_register_is_refused():
    [message] = _messages(_with_backtest("  backtest: {alias: backtest}\n"))
    assert "registration.backtest.alias: an alias applies only with register: true" in message


def test_a_template_as_alias_is_refused_not_rendered():
    # Aliases are plain names: a Jinja expression never reaches MLflow, rendered or not.
    [message] = _messages(_with_backtest("  backtest: {register: true, alias: '{{ ds }}'}\n"))
    assert message.endswith("registration.backtest.alias: must start with a letter and use only ASCII letters, digits, "
                            "'_' and '-', got '{{ ds }}'")


def test_promote_takes_deny_or_allow_only():
    [message] = _messages(_with_backtest("  backtest: {promote: always}\n"))
    assert "registration.backtest.promote: Input should be 'deny' or 'allow'" in message
