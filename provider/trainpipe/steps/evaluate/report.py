"""The evaluation report: one self-contained HTML page plus the PNG plots it embeds.

The candidate and the champion are drawn side by side on the same holdout. Plots per task type:

* binary classification: ROC curve, precision-recall curve, calibration (reliability) curve, and
  the confusion matrix at the decision threshold;
* multiclass classification: the confusion matrix of the most probable class (and a per-class table of
  precision, recall, F1 and support);
* regression: predicted vs actual, residuals vs predicted;
* ranking: nDCG@k for k = 1 .. max(10, the largest k the spec names).

With ``evaluation.slices`` the page has a table per slice column (every metric per value, both
models) and a bar chart of the first metric. The page inlines its CSS and its images (base64), so
the one file opens anywhere: from the MLflow run's artifacts, a download, or an e-mail.

matplotlib draws through ``Figure`` objects (the Agg canvas), never pyplot: no global state and no
display backend on a worker.
"""

from __future__ import annotations

import base64
import html
import io
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainpipe.steps.evaluate import metrics
from trainpipe.steps.evaluate.gate_table import CLASSES_REFERENCE

if TYPE_CHECKING:
    import numpy as np
    from matplotlib.figure import Figure

REPORT_FILE = "report.html"
# Scatter plots draw at most this many points: enough to see the shape, cheap on a large holdout.
_MAX_SCATTER_POINTS = 5_000
# The multiclass confusion matrix writes each cell's count up to this many classes, names each class up to
# _MAX_CLASS_TICKS (cut to _CLASS_TICK_CHARS characters), and grows with the classes up to _MAX_MATRIX_INCHES.
_MAX_ANNOTATED_CLASSES = 15
_MAX_CLASS_TICKS = 40
_CLASS_TICK_CHARS = 18
_MAX_MATRIX_INCHES = 9.0
_CANDIDATE_COLOR = "#1f77b4"
_CHAMPION_COLOR = "#ff7f0e"
_CSS = """
body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:2em auto;max-width:1100px;color:#222;padding:0 1em}
h1{font-size:1.5em}h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:1.6em}
table{border-collapse:collapse;margin:.6em 0}th,td{border:1px solid #ddd;padding:.3em .7em;text-align:left}
th{background:#f4f6f8}td.num{text-align:right;font-variant-numeric:tabular-nums}
.pass{color:#116b2f;font-weight:600}.fail{color:#b00020;font-weight:600}.muted{color:#777}
.verdict{display:inline-block;padding:.2em .6em;border-radius:4px;color:#fff}
.verdict.pass{background:#1e7e34;color:#fff}.verdict.fail{background:#b00020;color:#fff}
.plots{display:flex;flex-wrap:wrap;gap:1em}figure{margin:0}figure img{max-width:100%;border:1px solid #eee}
figcaption{font-size:.9em;color:#555}
"""


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelScores:
    """One model's predictions on the holdout and its metrics there."""

    label: str  # "candidate", "champion (version 3)"
    scores: np.ndarray
    metrics: dict[str, float]


@dataclass(frozen=True, slots=True, kw_only=True)
class ReportInputs:
    title: str
    task: str
    metric_names: tuple[str, ...]
    y_true: np.ndarray
    candidate: ModelScores
    champion: ModelScores | None
    decision_threshold: float
    # The evaluation's baseline model (trainpipe.steps.evaluate.baseline), shown beside the two in the metrics table.
    baseline: ModelScores | None = None
    groups: np.ndarray | None = None
    # Multiclass: the class names of the models' probability columns (y_true then holds class names).
    classes: tuple[str, ...] = ()
    # The champion's column head when there is no champion to show: none yet, or one that was not compared.
    without_champion: str = "champion (none yet)"
    # Column -> per value, as trainpipe.steps.evaluate.evaluate builds them (value, rows, candidate, champion, undefined).
    slices: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    # GateOutcome dicts.
    gates: tuple[dict[str, Any], ...] = ()
    # (label, value) rows of the summary table: model, runs, snapshot, holdout size, ...
    facts: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class Plot:
    file: str
    caption: str
    png: bytes


def write_report(inputs: ReportInputs, folder: Path) -> list[Path]:
    """Write ``report.html`` and every plot as PNG into ``folder``; returns the files written."""
    folder.mkdir(parents=True, exist_ok=True)
    plots = task_plots(inputs)
    slice_plots = {column: _slice_plot(inputs, column, entries) for column, entries in inputs.slices.items()}
    written = []
    for plot in [*plots, *slice_plots.values()]:
        path = folder / plot.file
        path.write_bytes(plot.png)
        written.append(path)
    page = folder / REPORT_FILE
    page.write_text(render_html(inputs, plots, slice_plots), encoding="utf-8")
    return [page, *written]


# ---------------------------------------------------------------------------------------------
# plots


def task_plots(inputs: ReportInputs) -> list[Plot]:
    models = [m for m in (inputs.candidate, inputs.champion) if m is not None]
    if inputs.task == "binary_classification":
        return [_roc(inputs, models), _precision_recall(inputs, models), _calibration(inputs, models),
                _confusion_matrices(inputs, models)]
    if inputs.task == "multiclass_classification":
        return [_class_confusion_matrices(inputs, models)]
    if inputs.task == "regression":
        return [_predicted_vs_actual(inputs, models), _residuals(inputs, models)]
    if inputs.task == "causal_lm":
        return []  # token-weighted numbers, in the metrics table (and per slice); no curve to draw
    return [_ndcg_over_k(inputs, models)]


def _figure(width: float = 5.2, height: float = 4.2, columns: int = 1, *, bottom: float = 0.12,
            top: float = 0.91) -> tuple[Figure, Any]:
    from matplotlib.figure import Figure

    # Fixed margins rather than constrained or tight layout: those lay out every figure with an
    # extra draw pass, about half of the report's drawing time.
    figure = Figure(figsize=(width * columns, height), dpi=100)
    figure.subplots_adjust(left=0.8 / (width * columns), right=0.97, bottom=bottom, top=top, wspace=0.35)
    axes = figure.subplots(1, columns, squeeze=False)[0]
    return figure, axes if columns > 1 else axes[0]


def _png(figure: Figure) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return buffer.getvalue()


def _color(index: int) -> str:
    return _CANDIDATE_COLOR if index == 0 else _CHAMPION_COLOR


def _roc(inputs: ReportInputs, models: list[ModelScores]) -> Plot:
    from sklearn.metrics import roc_auc_score, roc_curve

    figure, axes = _figure()
    for index, model in enumerate(models):
        if _one_class(inputs.y_true):
            break
        fpr, tpr, _ = roc_curve(inputs.y_true, model.scores)
        axes.plot(fpr, tpr, color=_color(index),
                  label=f"{model.label} (AUC {roc_auc_score(inputs.y_true, model.scores):.3f})")
    axes.plot([0, 1], [0, 1], linestyle=":", color="#999", label="chance")
    axes.set(xlabel="false positive rate", ylabel="true positive rate", title="ROC curve", xlim=(0, 1), ylim=(0, 1.01))
    axes.legend(loc="lower right")
    return Plot(file="roc.png", caption="ROC curve on the holdout", png=_png(figure))


def _precision_recall(inputs: ReportInputs, models: list[ModelScores]) -> Plot:
    from sklearn.metrics import average_precision_score, precision_recall_curve

    figure, axes = _figure()
    for index, model in enumerate(models):
        if _one_class(inputs.y_true):
            break
        precision, recall, _ = precision_recall_curve(inputs.y_true, model.scores)
        axes.plot(recall, precision, color=_color(index), drawstyle="steps-post",
                  label=f"{model.label} (AP {average_precision_score(inputs.y_true, model.scores):.3f})")
    axes.axhline(float(inputs.y_true.mean()), linestyle=":", color="#999", label="positive rate")
    axes.set(xlabel="recall", ylabel="precision", title="Precision-recall curve", xlim=(0, 1), ylim=(0, 1.01))
    axes.legend(loc="upper right")
    return Plot(file="precision_recall.png", caption="Precision-recall curve on the holdout", png=_png(figure))


def _calibration(inputs: ReportInputs, models: list[ModelScores]) -> Plot:
    from sklearn.calibration import calibration_curve

    figure, axes = _figure()
    for index, model in enumerate(models):
        # Quantile bins: with a rare positive class most scores sit near 0, and uniform bins above
        # it would hold a handful of rows each.
        observed, predicted = calibration_curve(inputs.y_true, model.scores, n_bins=10, strategy="quantile")
        axes.plot(predicted, observed, marker="o", color=_color(index), label=model.label)
    axes.plot([0, 1], [0, 1], linestyle=":", color="#999", label="perfectly calibrated")
    axes.set(xlabel="mean predicted probability (10 quantile bins)", ylabel="observed positive rate",
             title="Calibration", xlim=(0, 1), ylim=(0, 1))
    axes.legend(loc="upper left")
    return Plot(file="calibration.png", caption="Calibration: predicted probability against the observed rate",
                png=_png(figure))


def _confusion_matrices(inputs: ReportInputs, models: list[ModelScores]) -> Plot:
    from sklearn.metrics import confusion_matrix

    figure, axes = _figure(width=4.2, height=3.8, columns=len(models), top=0.85)
    axes_list = list(axes) if len(models) > 1 else [axes]
    for ax, model in zip(axes_list, models, strict=True):
        predicted = (model.scores >= inputs.decision_threshold).astype(int)
        matrix = confusion_matrix(inputs.y_true.astype(int), predicted, labels=[0, 1])
        ax.imshow(matrix, cmap="Blues")
        for (row, column), count in _cells(matrix):
            ax.text(column, row, f"{count:,}", ha="center", va="center",
                    color="white" if count > matrix.max() / 2 else "black")
        ax.set(xticks=[0, 1], yticks=[0, 1], xticklabels=["0", "1"], yticklabels=["0", "1"],
               xlabel="predicted", ylabel="actual", title=model.label)
    figure.suptitle(f"Confusion matrix at threshold {inputs.decision_threshold:g}")
    return Plot(file="confusion_matrix.png",
                caption=f"Confusion matrix at the decision threshold {inputs.decision_threshold:g}", png=_png(figure))


def _class_confusion_matrices(inputs: ReportInputs, models: list[ModelScores]) -> Plot:
    """Counts by actual (row) and predicted class, coloured by the share of the actual class's rows, so a rare
    class's errors show as clearly as a frequent one's."""
    import numpy as np

    classes = inputs.classes
    size = min(_MAX_MATRIX_INCHES, max(4.2, 0.35 * len(classes) + 2.0))
    figure, axes = _figure(width=size, height=size, columns=len(models), bottom=0.2, top=0.84)
    axes_list = list(axes) if len(models) > 1 else [axes]
    ticks = [_plain_text(name[:_CLASS_TICK_CHARS]) for name in classes] if len(classes) <= _MAX_CLASS_TICKS else []
    for ax, model in zip(axes_list, models, strict=True):
        matrix = metrics.class_confusion_matrix(inputs.y_true, model.scores, classes)
        share = matrix / np.maximum(matrix.sum(axis=1, keepdims=True), 1)
        ax.imshow(share, cmap="Blues", vmin=0.0, vmax=1.0)
        if len(classes) <= _MAX_ANNOTATED_CLASSES:
            for (row, column), count in _cells(matrix):
                ax.text(column, row, f"{count:,}", ha="center", va="center", fontsize="small",
                        color="white" if share[row, column] > 0.5 else "black")
        if ticks:
            ax.set_xticks(range(len(classes)), ticks, rotation=90, fontsize="small")
            ax.set_yticks(range(len(classes)), ticks, fontsize="small")
        else:
            ax.set(xticks=[], yticks=[])
        ax.set(xlabel="predicted", ylabel="actual", title=_plain_text(model.label))
    # Two lines: one line is wider than a small matrix's figure and was cut at both ends.
    figure.suptitle(f"Confusion matrix, {len(classes)} classes\n(colour: share of the actual class)", fontsize="medium")
    return Plot(file="confusion_matrix.png",
                caption="Confusion matrix of the most probable class (colour: share of the actual class's rows)",
                png=_png(figure))


def _plain_text(text: str) -> str:
    """``text`` as matplotlib draws it literally: a class name with two ``$`` would be parsed as math (and
    fail to draw when it is not valid TeX)."""
    return text.replace("$", r"\$")


def _cells(matrix: np.ndarray) -> list[tuple[tuple[int, int], int]]:
    return [((row, column), int(matrix[row, column])) for row in range(matrix.shape[0]) for column in range(matrix.shape[1])]


def _sample(size: int) -> np.ndarray:
    import numpy as np

    if size <= _MAX_SCATTER_POINTS:
        return np.arange(size)
    # Fixed seed: the same holdout gives the same picture.
    return np.sort(np.random.default_rng(0).choice(size, _MAX_SCATTER_POINTS, replace=False))


def _predicted_vs_actual(inputs: ReportInputs, models: list[ModelScores]) -> Plot:
    rows = _sample(inputs.y_true.size)
    figure, axes = _figure(width=4.6, columns=len(models), top=0.86)
    axes_list = list(axes) if len(models) > 1 else [axes]
    low = float(min(inputs.y_true.min(), *(m.scores.min() for m in models)))
    high = float(max(inputs.y_true.max(), *(m.scores.max() for m in models)))
    for index, (ax, model) in enumerate(zip(axes_list, models, strict=True)):
        ax.scatter(inputs.y_true[rows], model.scores[rows], s=6, alpha=0.4, color=_color(index))
        ax.plot([low, high], [low, high], linestyle=":", color="#555")
        ax.set(xlabel="actual", ylabel="predicted", title=model.label)
    figure.suptitle("Predicted vs actual")
    return Plot(file="predicted_vs_actual.png", caption="Predicted against actual values on the holdout",
                png=_png(figure))


def _residuals(inputs: ReportInputs, models: list[ModelScores]) -> Plot:
    rows = _sample(inputs.y_true.size)
    figure, axes = _figure(width=4.6, columns=len(models), top=0.86)
    axes_list = list(axes) if len(models) > 1 else [axes]
    for index, (ax, model) in enumerate(zip(axes_list, models, strict=True)):
        residual = inputs.y_true - model.scores
        ax.scatter(model.scores[rows], residual[rows], s=6, alpha=0.4, color=_color(index))
        ax.axhline(0.0, linestyle=":", color="#555")
        ax.set(xlabel="predicted", ylabel="actual - predicted", title=model.label)
    figure.suptitle("Residuals")
    return Plot(file="residuals.png", caption="Residuals (actual - predicted) against the prediction", png=_png(figure))


def ndcg_ks(metric_names: tuple[str, ...]) -> list[int]:
    """k = 1 .. max(10, the largest k among the spec's ranking metrics), at most 50."""
    named = [int(name.partition("@")[2]) for name in metric_names if "@" in name]
    return list(range(1, min(50, max([10, *named])) + 1))


def _ndcg_over_k(inputs: ReportInputs, models: list[ModelScores]) -> Plot:
    ks = ndcg_ks(inputs.metric_names)
    figure, axes = _figure(width=6.0)
    for index, model in enumerate(models):
        values = metrics.ndcg_curve(inputs.y_true, model.scores, inputs.groups, ks)
        axes.plot(ks, values, marker="o", markersize=3, color=_color(index), label=model.label)
    axes.set(xlabel="k", ylabel="mean nDCG@k over queries", title="nDCG@k")
    axes.legend(loc="lower right")
    return Plot(file="ndcg_at_k.png", caption="nDCG@k for k = 1.." + str(ks[-1]), png=_png(figure))


def _slice_plot(inputs: ReportInputs, column: str, entries: list[dict[str, Any]]) -> Plot:
    import numpy as np

    metric = inputs.metric_names[0]
    models = [("candidate", inputs.candidate.label)] + ([("champion", inputs.champion.label)] if inputs.champion else [])
    figure, axes = _figure(width=max(5.2, 0.6 * len(entries) + 2), height=4.6, bottom=0.3)
    positions = np.arange(len(entries))
    width = 0.8 / len(models)
    for index, (key, label) in enumerate(models):
        heights = [(entry.get(key) or {}).get(metric) for entry in entries]
        axes.bar(positions + index * width, [h if h is not None else 0.0 for h in heights], width=width,
                 color=_color(index), label=label)
    overall = inputs.candidate.metrics.get(metric)
    if overall is not None:
        axes.axhline(overall, linestyle=":", color="#555", label=f"candidate, whole holdout ({overall:.3f})")
    axes.set_xticks(positions + width * (len(models) - 1) / 2,
                    [f"{entry['value']}\n(n={entry['rows']:,})" for entry in entries])
    axes.set(ylabel=metric, title=f"{metric} per {column}")
    # Below the axes: inside, it would hide the bars it explains.
    axes.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2, fontsize="small", frameon=False)
    return Plot(file=f"slices_{_safe_name(column)}.png", caption=f"{metric} per value of {column}", png=_png(figure))


def _safe_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_") or "column"


def _one_class(y_true: np.ndarray) -> bool:
    import numpy as np

    return np.unique(y_true).size < 2


# ---------------------------------------------------------------------------------------------
# the page


def render_html(inputs: ReportInputs, plots: list[Plot], slice_plots: dict[str, Plot]) -> str:
    e = html.escape
    passed = all(gate["passed"] for gate in inputs.gates)
    verdict = "pass" if passed else "fail"
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{e(inputs.title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{e(inputs.title)}</h1>",
        f'<p><span class="verdict {verdict}">{"every gate passed" if passed else "a gate failed"}</span></p>',
        '<h2 id="summary">Summary</h2>',
        _table([], [[e(k), e(v)] for k, v in inputs.facts], with_header=False),
        '<h2 id="gates">Gates</h2>',
        _gates_table(inputs.gates) if inputs.gates else '<p class="muted">The spec sets no gate.</p>',
        '<h2 id="metrics">Metrics on the holdout</h2>',
        _metrics_table(inputs),
    ]
    if plots:  # none for a causal LM: its metrics are the whole story
        parts += ['<h2 id="plots">Plots</h2>',
                  '<div class="plots">' + "".join(_figure_html(plot) for plot in plots) + "</div>"]
    if inputs.classes:
        parts.append('<h2 id="classes">Per class</h2>')
        parts.append("<p>Each class's precision, recall and F1 on the holdout (the predicted class is the most probable "
                     "one); support is its rows. A blank cell is 0/0: precision of a class never predicted, recall "
                     "of a class the holdout lacks.</p>")
        parts.append(_class_table(inputs))
    if inputs.slices:
        parts.append('<h2 id="slices">Slices</h2>')
        parts.append("<p>Every metric on the rows of each slice value. A worst_slice gate takes the lowest value "
                     "over every slice (the highest for log_loss, rmse, mae, perplexity and loss); a blank cell is a metric the "
                     "slice cannot give.</p>")
        for column, entries in inputs.slices.items():
            parts.append(f'<h3 id="slice-{e(_safe_name(column))}">{e(column)}</h3>')
            parts.append(_slice_table(inputs, entries))
            parts.append('<div class="plots">' + _figure_html(slice_plots[column]) + "</div>")
    parts.append("</body></html>")
    return "\n".join(parts)


def _table(columns: list[str], rows: list[list[str]], *, with_header: bool = True) -> str:
    """Cells are HTML already (escaped by the caller); a cell starting with ``<td`` keeps its own tag."""
    head = "<tr>" + "".join(f"<th>{c}</th>" for c in columns) + "</tr>" if with_header else ""
    body = "".join("<tr>" + "".join(cell if cell.startswith("<td") else f"<td>{cell}</td>" for cell in row) + "</tr>"
                   for row in rows)
    return f"<table>{head}{body}</table>"


def _number(value: float | None, *, signed: bool = False) -> str:
    if value is None:
        return '<td class="num muted"></td>'
    return f'<td class="num">{value:+.4f}</td>' if signed else f'<td class="num">{value:.4f}</td>'


def _gates_table(gates: tuple[dict[str, Any], ...]) -> str:
    e = html.escape
    # The check of the champion's classes has no value (its 0.0 stands for none).
    rows = [[e(g["gate"]), f'<td class="{"pass" if g["passed"] else "fail"}">{"PASS" if g["passed"] else "FAIL"}</td>',
             _number(None if g.get("reference") == CLASSES_REFERENCE else g["value"]), _number(g["baseline"]),
             e(g["note"])] for g in gates]
    # The reference is the champion's value, or the baseline model's for a gate against the baseline.
    return _table(["gate", "verdict", "candidate", "champion or baseline", "note"], rows)


def _metrics_table(inputs: ReportInputs) -> str:
    e = html.escape
    champion = inputs.champion
    rows = []
    for name in inputs.metric_names:
        value = inputs.candidate.metrics.get(name)
        baseline = champion.metrics.get(name) if champion else None
        change = value - baseline if value is not None and baseline is not None else None
        direction = "higher is better" if metrics.higher_is_better(name) else "lower is better"
        row = [e(name), _number(value), _number(baseline), _number(change, signed=True)]
        if inputs.baseline is not None:
            row.append(_number(inputs.baseline.metrics.get(name)))
        rows.append([*row, e(direction)])
    champion_label = e(champion.label) if champion else e(inputs.without_champion)
    columns = ["metric", e(inputs.candidate.label), champion_label, "change"]
    if inputs.baseline is not None:
        columns.append(e(inputs.baseline.label))
    return _table([*columns, ""], rows)


def _slice_table(inputs: ReportInputs, entries: list[dict[str, Any]]) -> str:
    e = html.escape
    has_champion = inputs.champion is not None
    columns = ["value", "rows"]
    for name in inputs.metric_names:
        columns += [f"{e(name)}<br>candidate", f"{e(name)}<br>champion"] if has_champion else [e(name)]
    rows = []
    for entry in entries:
        row = [e(entry["value"]), f'<td class="num">{entry["rows"]:,}</td>']
        for name in inputs.metric_names:
            row.append(_number((entry.get("candidate") or {}).get(name)))
            if has_champion:
                row.append(_number((entry.get("champion") or {}).get(name)))
        rows.append(row)
    table = _table(columns, rows)
    undefined = sorted({f"{name}: {reason}" for entry in entries
                        for name, reason in (entry.get("undefined") or {}).items()})
    if undefined:
        table += '<p class="muted">Blank cells: ' + "; ".join(e(u) for u in undefined) + "</p>"
    return table


def _class_table(inputs: ReportInputs) -> str:
    e = html.escape
    models = [m for m in (inputs.candidate, inputs.champion) if m is not None]
    per_model = [metrics.per_class_metrics(inputs.y_true, model.scores, inputs.classes) for model in models]
    columns = ["class", "support"]
    for model in models:
        columns += [f"precision<br>{e(model.label)}", f"recall<br>{e(model.label)}", f"F1<br>{e(model.label)}"]
    rows = []
    for index, name in enumerate(inputs.classes):
        row = [e(name), f'<td class="num">{per_model[0][index]["support"]:,}</td>']
        for entries in per_model:
            row += [_number(entries[index][key]) for key in ("precision", "recall", "f1")]
        rows.append(row)
    return _table(columns, rows)


def _figure_html(plot: Plot) -> str:
    data = base64.b64encode(plot.png).decode("ascii")
    caption = html.escape(plot.caption)
    return (f'<figure><img src="data:image/png;base64,{data}" alt="{caption}" data-file="{html.escape(plot.file)}">'
            f"<figcaption>{caption} ({html.escape(plot.file)})</figcaption></figure>")
