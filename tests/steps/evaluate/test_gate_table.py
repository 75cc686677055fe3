"""The gate table and its renderings, from an evaluate XCom as the task returns it."""

from __future__ import annotations

from trainpipe.steps.evaluate.gate_table import as_html, as_markdown, as_text, gate_table, summary

EVALUATION = {
    "candidate": {"auc": 0.91234567, "f1": 0.4},
    "champion": {"auc": 0.92, "f1": 0.5},
    "champion_version": 3,
    "gates": [
        {"gate": "auc >= 0.95", "metric": "auc", "value": 0.91234567, "baseline": None, "compared": 0.91234567,
         "threshold": 0.95, "passed": False, "note": "absolute"},
        {"gate": "auc >= +0.1% vs champion", "metric": "auc", "value": 0.91234567, "baseline": 0.92,
         "compared": -0.0083, "threshold": 0.001, "passed": False, "note": "-0.832% vs champion"},
        {"gate": "f1 >= 0.3", "metric": "f1", "value": 0.4, "baseline": None, "compared": 0.4, "threshold": 0.3,
         "passed": True, "note": "absolute"},
        # A gate on a value that is not one of the candidate's metrics gets its own row.
        {"gate": "min_slice(auc) >= 0.75", "metric": "min_slice(auc)", "value": 0.7, "baseline": 0.8,
         "compared": 0.7, "threshold": 0.75, "passed": False, "note": "worst slice: region=eu"},
    ],
    "gates_passed": False,
}


def test_text_table_has_a_row_per_metric_with_candidate_champion_change_and_verdicts():
    assert as_text(gate_table(EVALUATION)).splitlines() == [
        "metric          candidate  champion v3  change     gates",
        "auc             0.912346   0.920000     -0.007654  FAIL auc >= 0.95; FAIL auc >= +0.1% vs champion "
        "(-0.832% vs champion)",
        "f1              0.400000   0.500000     -0.100000  PASS f1 >= 0.3",
        "min_slice(auc)  0.700000   0.800000     -0.100000  FAIL min_slice(auc) >= 0.75 (worst slice: region=eu)",
    ]


def test_markdown_and_html_escape_what_would_break_them():
    evaluation = {**EVALUATION, "gates": [{**EVALUATION["gates"][2], "gate": "f1 >= 0.3 | <b>"}]}
    table = gate_table(evaluation)

    markdown = as_markdown(table).splitlines()
    assert markdown[:2] == ["| metric | candidate | champion v3 | change | gates |", "| --- | --- | --- | --- | --- |"]
    assert markdown[3] == "| f1 | 0.400000 | 0.500000 | -0.100000 | PASS f1 >= 0.3 \\| <b> |"
    html = as_html(table)
    assert "<td>PASS f1 &gt;= 0.3 | &lt;b&gt;</td>" in html and "<th align=\"left\">champion v3</th>" in html


def test_first_candidate_has_no_champion_column_values():
    evaluation = {"candidate": {"auc": 0.8}, "champion": None, "champion_version": None,
                  "gates": [{"gate": "auc >= 0.7", "metric": "auc", "value": 0.8, "baseline": None, "compared": 0.8,
                             "threshold": 0.7, "passed": True, "note": "absolute"}], "gates_passed": True}

    assert as_text(gate_table(evaluation)).splitlines() == [
        "metric  candidate  champion (none)  change  gates",
        "auc     0.800000   -                -       PASS auc >= 0.7",
    ]
    assert summary(gate_table(evaluation), consequence="registered") == "gates passed (1); registered"


def test_summary_is_one_line_naming_each_failed_gate_and_its_value():
    line = summary(gate_table(EVALUATION), consequence="nothing registered")

    assert line == ("gates failed (3 of 4): auc >= 0.95 (got 0.912346); auc >= +0.1% vs champion (got 0.912346, "
                    "-0.832% vs champion); min_slice(auc) >= 0.75 (got 0.700000, worst slice: region=eu); "
                    "nothing registered")
    assert "\n" not in line


def test_a_worst_slice_gate_shows_its_slice_value_not_the_overall_metric():
    # As evaluate returns it: a worst_slice gate names the plain metric, its value is the worst slice's.
    evaluation = {
        "candidate": {"auc": 0.436675}, "champion": None, "champion_version": None,
        "gates": [{"gate": "worst_slice(auc) >= 0.75", "metric": "auc", "value": 0.402863, "baseline": None,
                   "compared": 0.402863, "threshold": 0.75, "passed": False,
                   "note": "absolute; worst slice region=eu (812 rows)"}],
        "gates_passed": False,
    }
    table = gate_table(evaluation)

    assert summary(table, consequence="nothing registered") == (
        "gates failed (1 of 1): worst_slice(auc) >= 0.75 (got 0.402863, worst slice region=eu (812 rows)); "
        "nothing registered")
    assert as_text(table).splitlines()[1:] == [
        "auc               0.436675   -                -       -",
        "worst_slice(auc)  0.402863   -                -       FAIL worst_slice(auc) >= 0.75 (worst slice region=eu "
        "(812 rows))",
    ]


def test_a_champion_with_other_classes_leads_the_table_without_a_value_and_the_note_keeps_its_message():
    # As evaluate returns it for a multiclass champion whose classes differ (its value 0.0 stands for none).
    difference = "the candidate's classes differ from the champion's: new 'x'; missing 'y'"
    evaluation = {
        "candidate": {"macro_f1": 0.8}, "champion": None, "champion_version": 3,
        "gates": [{"gate": "same classes as the champion", "metric": "classes", "value": 0.0, "baseline": None,
                   "compared": 0.0, "threshold": 0.0, "passed": False, "note": difference, "reference": "classes"},
                  {"gate": "macro_f1 >= 0.7", "metric": "macro_f1", "value": 0.8, "baseline": None, "compared": 0.8,
                   "threshold": 0.7, "passed": True, "note": "absolute"}],
        "gates_passed": False,
    }
    table = gate_table(evaluation)

    assert as_text(table).splitlines() == [
        "metric    candidate  champion v3  change  gates",
        f"classes   -          -            -       FAIL same classes as the champion ({difference})",
        "macro_f1  0.800000   -            -       PASS macro_f1 >= 0.7",
    ]
    assert summary(table, consequence="nothing registered") == (
        f"gates failed (1 of 2): same classes as the champion ({difference}); nothing registered")
