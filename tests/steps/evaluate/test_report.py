"""The evaluation report (trainpipe.steps.evaluate.report) and the slices behind it (trainpipe.steps.evaluate.metrics,
trainpipe.steps.evaluate.evaluate): sections and plots per task type, slice metrics against sklearn on the
filtered rows, and worst_slice gates."""

from __future__ import annotations

import base64
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from sklearn import metrics as skm

from trainpipe.plan.model import EvaluationPlan
from trainpipe.spec.sections.evaluation import EvaluationSpec
from trainpipe.steps.evaluate import metrics
from trainpipe.steps.evaluate.evaluate import (
    MAX_SLICE_VALUES,
    SliceColumnError,
    check_gate,
    check_gates,
    holdout_slices,
)
from trainpipe.steps.evaluate.report import ModelScores, ReportInputs, ndcg_ks, write_report

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


class _Page(HTMLParser):
    """Headings, embedded images and tables of a report page."""

    def __init__(self) -> None:
        super().__init__()
        self.headings: list[tuple[str, str]] = []
        self.images: list[dict[str, str]] = []
        self.tables = 0
        self.cells: list[str] = []
        self.links: list[str] = []
        self._heading: str | None = None
        self._in_cell = False

    def handle_starttag(self, tag, attrs):
        attributes = dict(attrs)
        if tag in ("h1", "h2", "h3"):
            self._heading, self._text = tag, ""
        elif tag == "img":
            self.images.append(attributes)
        elif tag == "table":
            self.tables += 1
        elif tag in ("td", "th"):
            self._in_cell, self._text = True, ""
        elif tag in ("link", "script"):
            self.links.append(tag)

    def handle_data(self, data):
        if self._heading or self._in_cell:
            self._text += data

    def handle_endtag(self, tag):
        if tag == self._heading:
            self.headings.append((tag, self._text.strip()))
            self._heading = None
        elif tag in ("td", "th") and self._in_cell:
            self.cells.append(self._text.strip())
            self._in_cell = False


def _parse(path: Path) -> _Page:
    page = _Page()
    page.feed(path.read_text(encoding="utf-8"))
    return page


def _embedded_files(page: _Page) -> dict[str, bytes]:
    out = {}
    for image in page.images:
        prefix = "data:image/png;base64,"
        assert image["src"].startswith(prefix), "images are embedded, not linked"
        out[image["data-file"]] = base64.b64decode(image["src"].removeprefix(prefix))
    return out


def _binary_holdout(rows: int = 600, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    label = (rng.random(rows) < 0.3).astype(int)
    region = rng.choice(["north", "south", "east"], size=rows, p=[0.5, 0.3, 0.2]).astype(object)
    region[:7] = None  # missing values form their own slice
    # The model is good in north, poor in east.
    noise = np.where(region == "east", 1.6, 0.6)
    score = 1 / (1 + np.exp(-((label * 2 - 1) * 1.2 + rng.normal(0, 1, rows) * noise)))
    return pd.DataFrame({"label": label, "region": region, "score": score, "weaker": np.clip(score * 0.7 + 0.15, 0, 1)})


def _plan(task: str, names: tuple[str, ...], *, slices: tuple[str, ...] = ("region",), group: str | None = None,
          gates: list[str] | None = None) -> EvaluationPlan:
    from trainpipe.plan.model import Gate

    spec_gates = EvaluationSpec(metrics=list(names), gates=gates or [], slices=list(slices)).gates
    return EvaluationPlan(task=task, features=("x",), label="label", group_column=group, metrics=names,
                          decision_threshold=0.4, slices=slices,
                          gates=tuple(Gate(metric=g.metric, op=g.op, threshold=g.threshold, relative=g.relative,
                                           text=str(g), worst_slice=g.worst_slice) for g in spec_gates))


def _inputs(task: str, names: tuple[str, ...], y_true, candidate, champion, *, groups=None, slices=None, gates=()):
    def scores(label, values):
        return ModelScores(label=label, scores=np.asarray(values, dtype=float),
                           metrics=metrics.compute_metrics(task, list(names), y_true=y_true, y_score=values,
                                                           groups=groups, threshold=0.4))

    return ReportInputs(title="Evaluation of demo: candidate vs champion", task=task, metric_names=names,
                        y_true=np.asarray(y_true, dtype=float), candidate=scores("candidate", candidate),
                        champion=scores("champion (version 3)", champion) if champion is not None else None,
                        decision_threshold=0.4, groups=groups, slices=slices or {}, gates=tuple(gates),
                        facts=(("registered model", "demo"), ("holdout rows", str(len(y_true)))))


# ---------------------------------------------------------------------------------------------
# the page


def test_binary_report_has_its_sections_plots_and_slices(tmp_path):
    holdout = _binary_holdout()
    names = ("auc", "f1", "log_loss")
    plan = _plan("binary_classification", names, gates=["auc >= 0.7", "worst_slice(auc) >= 0.99"])
    slices = holdout_slices(plan, holdout, holdout["score"].to_numpy(), holdout["weaker"].to_numpy())
    evaluation = {"candidate": {"auc": 0.9, "f1": 0.6, "log_loss": 0.4}, "champion": None, "slices": slices}
    from dataclasses import asdict

    outcomes = [asdict(o) for o in check_gates(plan.gates, evaluation)]
    inputs = _inputs("binary_classification", names, holdout["label"].to_numpy(), holdout["score"].to_numpy(),
                     holdout["weaker"].to_numpy(), slices=slices, gates=outcomes)

    files = write_report(inputs, tmp_path)

    assert {f.name for f in files} == {"report.html", "roc.png", "precision_recall.png", "calibration.png",
                                       "confusion_matrix.png", "slices_region.png"}
    page = _parse(tmp_path / "report.html")
    assert [h for h in page.headings if h[0] == "h2"] == [
        ("h2", "Summary"), ("h2", "Gates"), ("h2", "Metrics on the holdout"), ("h2", "Plots"), ("h2", "Slices")]
    assert ("h3", "region") in page.headings
    assert page.links == []  # self-contained: no stylesheet or script to fetch
    embedded = _embedded_files(page)
    assert set(embedded) == {f.name for f in files if f.suffix == ".png"}
    for name, png in embedded.items():
        assert png.startswith(PNG_MAGIC) and png == (tmp_path / name).read_bytes()
    # The gate table: the verdicts, and the failing worst-slice gate names the slice.
    assert "worst_slice(auc) >= 0.99" in page.cells and "FAIL" in page.cells and "PASS" in page.cells
    assert 'class="verdict fail">a gate failed<' in (tmp_path / "report.html").read_text()
    assert any("worst slice region=east" in cell for cell in page.cells)
    # Candidate and champion side by side: the metrics table heads both.
    assert {"candidate", "champion (version 3)"} <= set(page.cells)
    # The slice table lists every value with its row count, the missing slice included.
    for entry in slices["region"]:
        assert entry["value"] in page.cells and f"{entry['rows']:,}" in page.cells
    assert metrics.MISSING_SLICE in page.cells


def test_regression_report_draws_residuals_and_predicted_vs_actual(tmp_path):
    rng = np.random.default_rng(3)
    actual = rng.normal(10, 3, 400)
    files = write_report(_inputs("regression", ("rmse", "mae", "r2"), actual, actual + rng.normal(0, 1, 400), None),
                         tmp_path)

    assert {f.name for f in files} == {"report.html", "predicted_vs_actual.png", "residuals.png"}
    page = _parse(tmp_path / "report.html")
    assert ("h2", "Slices") not in page.headings  # no slices configured
    assert "champion (none yet)" in page.cells
    assert set(_embedded_files(page)) == {"predicted_vs_actual.png", "residuals.png"}


def test_ranking_report_draws_ndcg_over_k(tmp_path):
    rng = np.random.default_rng(5)
    groups = np.repeat(np.arange(40), 10)
    relevance = rng.integers(0, 4, groups.size)
    files = write_report(_inputs("ranking", ("ndcg@5", "map@20"), relevance, relevance + rng.normal(0, 1, groups.size),
                                 rng.normal(0, 1, groups.size), groups=groups), tmp_path)

    assert {f.name for f in files} == {"report.html", "ndcg_at_k.png"}
    page = _parse(tmp_path / "report.html")
    assert page.images[0]["alt"] == "nDCG@k for k = 1..20"
    assert ndcg_ks(("ndcg@5",)) == list(range(1, 11)) and ndcg_ks(("ndcg@100",))[-1] == 50


@pytest.mark.parametrize("ties", [False, True])
def test_ndcg_curve_equals_the_metric_at_every_k(ties):
    rng = np.random.default_rng(6)
    groups = np.repeat(np.arange(60), rng.integers(1, 15, 60))  # queries of 1 to 14 documents
    relevance = rng.integers(0, 4, groups.size)
    score = np.round(rng.normal(0, 1, groups.size), 0 if ties else 6)  # rounding makes many ties

    curve = metrics.ndcg_curve(relevance, score, groups, range(1, 21))

    expected = metrics.compute_metrics("ranking", [f"ndcg@{k}" for k in range(1, 21)], y_true=relevance,
                                       y_score=score, groups=groups)
    assert curve == pytest.approx(list(expected.values()), abs=1e-12)


def test_report_text_is_escaped(tmp_path):
    inputs = _inputs("regression", ("rmse",), np.arange(5.0), np.arange(5.0) + 0.5, None)
    from dataclasses import replace

    write_report(replace(inputs, facts=(("registered model", "<script>alert(1)</script>"),)), tmp_path)
    text = (tmp_path / "report.html").read_text()
    assert "<script>" not in text and "&lt;script&gt;alert(1)&lt;/script&gt;" in text


def _multiclass_inputs(classes: tuple[str, ...], *, with_champion: bool) -> ReportInputs:
    rng = np.random.default_rng(11)
    y_true = rng.choice(classes, 400).astype(object)
    own = np.asarray([classes.index(name) for name in y_true])

    def probabilities(spread: float) -> np.ndarray:
        logits = rng.normal(0, spread, (own.size, len(classes)))
        logits[np.arange(own.size), own] += 2.0
        return np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)

    def scores(label: str, values: np.ndarray) -> ModelScores:
        return ModelScores(label=label, scores=values, metrics=metrics.compute_metrics(
            "multiclass_classification", ["macro_f1", "log_loss"], y_true=y_true, y_score=values, classes=classes))

    return ReportInputs(title="Evaluation of zoo", task="multiclass_classification", metric_names=("macro_f1", "log_loss"),
                        y_true=y_true, candidate=scores("candidate", probabilities(1.0)),
                        champion=scores("champion (version 3)", probabilities(2.0)) if with_champion else None,
                        decision_threshold=0.5, classes=classes)


def test_multiclass_report_draws_the_confusion_matrix_and_a_per_class_table(tmp_path):
    classes = ("cat", "dog", "owl")
    inputs = _multiclass_inputs(classes, with_champion=True)

    files = write_report(inputs, tmp_path)

    assert {f.name for f in files} == {"report.html", "confusion_matrix.png"}
    page = _parse(tmp_path / "report.html")
    assert ("h2", "Per class") in page.headings
    embedded = _embedded_files(page)
    assert set(embedded) == {"confusion_matrix.png"} and embedded["confusion_matrix.png"].startswith(PNG_MAGIC)
    # One row per class: its support, then precision, recall and F1 of each model, as metrics computes them.
    assert page.cells[page.cells.index("class"):][:8] == [
        "class", "support", "precisioncandidate", "recallcandidate", "F1candidate",
        "precisionchampion (version 3)", "recallchampion (version 3)", "F1champion (version 3)"]
    for model, offset in ((inputs.candidate, 2), (inputs.champion, 5)):
        for row in metrics.per_class_metrics(inputs.y_true, model.scores, classes):
            cells = page.cells[page.cells.index(row["class"]):][:8]
            assert cells[1] == f"{row['support']:,}"
            assert cells[offset:offset + 3] == [f"{row[key]:.4f}" for key in ("precision", "recall", "f1")]


def test_multiclass_class_names_are_escaped_in_the_page_and_drawn_literally(tmp_path):
    classes = ("<script>alert(1)</script>", "$\\frac{$", "plain")
    write_report(_multiclass_inputs(classes, with_champion=False), tmp_path)

    text = (tmp_path / "report.html").read_text()
    assert "<script>" not in text and "<td>&lt;script&gt;alert(1)&lt;/script&gt;</td>" in text
    assert "<td>$\\frac{$</td>" in text  # not TeX to matplotlib either: the plot was drawn
    assert (tmp_path / "confusion_matrix.png").read_bytes().startswith(PNG_MAGIC)


def test_a_multiclass_report_of_many_classes_stays_drawable(tmp_path):
    classes = tuple(f"class_{index}" for index in range(120))
    write_report(_multiclass_inputs(classes, with_champion=False), tmp_path)

    page = _parse(tmp_path / "report.html")
    assert all(name in page.cells for name in classes)
    assert _embedded_files(page)["confusion_matrix.png"].startswith(PNG_MAGIC)


def test_multiclass_slices_of_both_models_lacking_classes(tmp_path):
    holdout = pd.DataFrame({"label": ["a", "a", "b", "c", "b"], "region": ["x", "x", "y", "y", "y"]})
    probabilities = np.asarray([[0.6, 0.3, 0.1], [0.2, 0.5, 0.3], [0.1, 0.7, 0.2], [0.3, 0.3, 0.4], [0.5, 0.4, 0.1]])
    plan = _plan("multiclass_classification", ("accuracy", "macro_f1"))

    slices = holdout_slices(plan, holdout, probabilities, probabilities[:, [0, 2, 1]], ("a", "b", "c"))

    x, y = slices["region"]
    assert x["candidate"] == pytest.approx({"accuracy": 0.5, "macro_f1": 1 / 3}) and x["undefined"] == {}
    assert y["champion"]["accuracy"] == pytest.approx(0.0)  # b and c swapped: rows b, c, b predicted c, b, a


# ---------------------------------------------------------------------------------------------
# slice metrics


def test_slice_metrics_equal_sklearn_on_the_filtered_rows():
    holdout = _binary_holdout()
    plan = _plan("binary_classification", ("auc", "f1", "log_loss", "pr_auc"))

    slices = holdout_slices(plan, holdout, holdout["score"].to_numpy(), holdout["weaker"].to_numpy())

    entries = {entry["value"]: entry for entry in slices["region"]}
    assert set(entries) == {"north", "south", "east", metrics.MISSING_SLICE}
    for value, entry in entries.items():
        rows = holdout["region"].isna() if value == metrics.MISSING_SLICE else holdout["region"] == value
        part = holdout[rows]
        assert entry["rows"] == len(part)
        for model, column in (("candidate", "score"), ("champion", "weaker")):
            got = entry[model]
            if part["label"].nunique() < 2:  # the 7-row missing slice may hold one class
                assert got["auc"] is None and "only class" in entry["undefined"]["auc"]
                continue
            assert got["auc"] == pytest.approx(skm.roc_auc_score(part["label"], part[column]))
            assert got["pr_auc"] == pytest.approx(skm.average_precision_score(part["label"], part[column]))
            assert got["f1"] == pytest.approx(skm.f1_score(part["label"], part[column] >= 0.4))
            assert got["log_loss"] == pytest.approx(skm.log_loss(part["label"], part[column], labels=[0, 1]))


def test_regression_slices_equal_sklearn_and_worst_is_the_highest_error():
    rng = np.random.default_rng(8)
    holdout = pd.DataFrame({"label": rng.normal(0, 1, 300), "segment": rng.choice([1, 2, 3], 300)})
    # Segment 3 is predicted badly.
    prediction = holdout["label"] + rng.normal(0, 1, 300) * np.where(holdout["segment"] == 3, 2.0, 0.2)

    slices = holdout_slices(_plan("regression", ("rmse", "r2"), slices=("segment",)), holdout, prediction.to_numpy(), None)

    for entry in slices["segment"]:
        part = holdout["segment"] == int(entry["value"])
        assert entry["candidate"]["rmse"] == pytest.approx(skm.root_mean_squared_error(holdout["label"][part], prediction[part]))
        assert entry["champion"] is None
    column, worst = metrics.worst_slice("rmse", slices, model="candidate")
    assert (column, worst["value"]) == ("segment", "3")  # rmse: lower is better, so the worst is the max
    column, worst = metrics.worst_slice("r2", slices, model="candidate")
    assert worst["value"] == "3"  # r2: higher is better, so the worst is the min


def test_ranking_slices_average_the_queries_of_the_slice():
    rng = np.random.default_rng(9)
    groups = np.repeat(np.arange(30), 8)
    market = np.where(groups < 10, "de", "fr")
    relevance = rng.integers(0, 3, groups.size)
    score = relevance + rng.normal(0, 1, groups.size)
    holdout = pd.DataFrame({"label": relevance, "q": groups, "market": market})

    slices = holdout_slices(_plan("ranking", ("ndcg@5",), slices=("market",), group="q"), holdout, score, None)

    for entry in slices["market"]:
        rows = market == entry["value"]
        expected = metrics.compute_metrics("ranking", ["ndcg@5"], y_true=relevance[rows], y_score=score[rows],
                                           groups=groups[rows])["ndcg@5"]
        assert entry["candidate"]["ndcg@5"] == pytest.approx(expected)
    assert [e["rows"] for e in slices["market"]] == [80, 160]


def test_a_slice_column_missing_from_the_holdout_or_too_fine_is_refused():
    holdout = _binary_holdout()
    with pytest.raises(SliceColumnError, match="column 'country' is not in the holdout"):
        holdout_slices(_plan("binary_classification", ("auc",), slices=("country",)), holdout, holdout["score"].to_numpy(), None)
    holdout["row_id"] = np.arange(len(holdout))
    too_many = f"has {len(holdout)} distinct values in the holdout, more than {MAX_SLICE_VALUES}"
    with pytest.raises(SliceColumnError, match=too_many):
        holdout_slices(_plan("binary_classification", ("auc",), slices=("row_id",)), holdout, holdout["score"].to_numpy(), None)


# ---------------------------------------------------------------------------------------------
# worst_slice gates


def _slices(candidate: dict[str, float], champion: dict[str, float] | None = None) -> dict:
    return {"region": [{"value": v, "rows": 100, "candidate": {"auc": a},
                        "champion": {"auc": champion[v]} if champion else None, "undefined": {}}
                       for v, a in candidate.items()]}


def _gate(text: str):
    return _plan("binary_classification", ("auc", "log_loss"), gates=[text]).gates[0]


def test_worst_slice_gate_passes_and_fails_on_the_lowest_slice():
    slices = _slices({"north": 0.91, "south": 0.80, "west": 0.76})

    passed = check_gate(_gate("worst_slice(auc) >= 0.75"), {"auc": 0.9}, None, slices)
    failed = check_gate(_gate("worst_slice(auc) >= 0.78"), {"auc": 0.9}, None, slices)

    assert passed.passed and passed.value == 0.76 and "worst slice region=west (100 rows)" in passed.note
    assert not failed.passed and failed.value == 0.76
    assert failed.gate == "worst_slice(auc) >= 0.78"


def test_worst_slice_of_a_lower_is_better_metric_is_the_highest():
    slices = {"region": [{"value": v, "rows": 10, "candidate": {"log_loss": x}, "champion": None, "undefined": {}}
                         for v, x in (("north", 0.2), ("west", 0.5))]}

    outcome = check_gate(_gate("worst_slice(log_loss) <= 0.4"), {"log_loss": 0.3}, None, slices)

    assert not outcome.passed and outcome.value == 0.5 and "region=west" in outcome.note


def test_relative_worst_slice_gate_compares_each_models_worst_slice():
    slices = _slices({"north": 0.90, "west": 0.79}, champion={"north": 0.95, "west": 0.80})
    gate = _gate("worst_slice(auc) >= -2%")

    outcome = check_gate(gate, {"auc": 0.9}, {"auc": 0.9}, slices)

    assert outcome.baseline == 0.80 and outcome.compared == pytest.approx(-0.0125) and outcome.passed
    assert not check_gate(_gate("worst_slice(auc) >= -1%"), {"auc": 0.9}, {"auc": 0.9}, slices).passed


def test_worst_slice_gate_fails_when_no_slice_has_the_metric():
    slices = {"region": [{"value": "north", "rows": 3, "candidate": {"auc": None}, "champion": None,
                          "undefined": {"auc": "auc: y_true holds only class 0; it needs both 0 and 1"}}]}

    outcome = check_gate(_gate("worst_slice(auc) >= 0.5"), {"auc": 0.9}, None, slices)

    assert not outcome.passed and outcome.note == "no slice has a value of auc"
