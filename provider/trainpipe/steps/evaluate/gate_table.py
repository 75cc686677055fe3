"""The gate table: candidate vs champion per metric with each gate's verdict, from evaluate's XCom.

One table, four renderings: plain text (the WARNING log line and the error of a failed run), Markdown (the
approval task's body in the Airflow UI), HTML (e-mail) and a one-line summary (the DAG run's note). Airflow-free.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Any

# The ``reference`` of evaluate's outcome that checks the champion's classes (multiclass): it has no value, so
# its row shows none and the run's note gives its message whole.
CLASSES_REFERENCE = "classes"


@dataclass(frozen=True, slots=True, kw_only=True)
class GateVerdict:
    gate: str
    passed: bool
    note: str
    # The gate's own value: a worst_slice gate's is its worst slice's, not the candidate's overall metric.
    value: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class MetricRow:
    metric: str
    candidate: float | None
    champion: float | None
    gates: tuple[GateVerdict, ...] = ()
    # The evaluation's baseline model on the same holdout (None: no baseline, or not one of its metrics).
    baseline: float | None = None

    @property
    def change(self) -> float | None:
        if self.candidate is None or self.champion is None:
            return None
        return self.candidate - self.champion


@dataclass(frozen=True, slots=True, kw_only=True)
class GateTable:
    rows: tuple[MetricRow, ...]
    champion_version: int | None
    passed: bool
    # The baseline model's name when the evaluation fitted one: the table then has its column.
    baseline_model: str | None = None

    @property
    def failed(self) -> tuple[tuple[MetricRow, GateVerdict], ...]:
        return tuple((row, v) for row in self.rows for v in row.gates if not v.passed)

    @property
    def gate_count(self) -> int:
        return sum(len(row.gates) for row in self.rows)


def gate_table(evaluation: dict[str, Any]) -> GateTable:
    """From evaluate's XCom (keys ``candidate``, ``champion``, ``champion_version``, ``gates``, ``gates_passed``).

    A gate on a value that is not one of the candidate's metrics (a slice's worst value, say) gets a row of
    its own, with the gate's value and baseline: ``worst_slice(auc) >= 0.75`` is the row ``worst_slice(auc)``.
    """
    candidate: dict[str, float] = evaluation.get("candidate") or {}
    champion: dict[str, float] = evaluation.get("champion") or {}
    by_metric: dict[str, list[GateVerdict]] = {}
    extra: dict[str, tuple[float | None, float | None]] = {}
    leading: set[str] = set()
    for outcome in evaluation.get("gates") or []:
        metric = _row_metric(outcome)
        value = outcome.get("value")
        if outcome.get("reference") == CLASSES_REFERENCE:
            # First in the table: when it fails, nothing else was compared with the champion.
            value = None
            leading.add(metric)
        by_metric.setdefault(metric, []).append(
            GateVerdict(gate=outcome["gate"], passed=bool(outcome["passed"]), note=_shown_note(outcome.get("note")),
                        value=value))
        if metric not in candidate:
            extra.setdefault(metric, (value, outcome.get("baseline")))
    baseline: dict[str, float] = evaluation.get("baseline") or {}
    rows = [MetricRow(metric=m, candidate=v, champion=champion.get(m), gates=tuple(by_metric.get(m, ())),
                      baseline=baseline.get(m))
            for m, v in candidate.items()]
    rows += [MetricRow(metric=m, candidate=value, champion=baseline, gates=tuple(by_metric[m]))
             for m, (value, baseline) in extra.items()]
    rows.sort(key=lambda row: row.metric not in leading)
    version = evaluation.get("champion_version")
    return GateTable(rows=tuple(rows), champion_version=int(version) if version is not None else None,
                     passed=bool(evaluation.get("gates_passed", all(v.passed for r in rows for v in r.gates))),
                     baseline_model=evaluation.get("baseline_model") if evaluation.get("baseline") else None)


def _row_metric(outcome: dict[str, Any]) -> str:
    """A worst_slice gate is on the worst slice's value (evaluate's outcome names the plain metric)."""
    metric = outcome["metric"]
    if str(outcome["gate"]).startswith("worst_slice(") and not metric.startswith("worst_slice("):
        return f"worst_slice({metric})"
    return metric


def _shown_note(note: str | None) -> str:
    """The outcome's note without the word ``absolute`` (every absolute gate has it: it says nothing)."""
    return (note or "").removeprefix("absolute").removeprefix("; ")


def _number(value: float | None, *, signed: bool = False) -> str:
    if value is None:
        return "-"
    return f"{value:+.6f}" if signed else f"{value:.6f}"


def _verdicts(row: MetricRow) -> str:
    if not row.gates:
        return "-"
    return "; ".join(f"{'PASS' if v.passed else 'FAIL'} {v.gate}" + (f" ({v.note})" if v.note else "")
                     for v in row.gates)


def _champion_header(table: GateTable) -> str:
    return f"champion v{table.champion_version}" if table.champion_version is not None else "champion (none)"


def _cells(table: GateTable) -> tuple[list[str], list[list[str]]]:
    header = ["metric", "candidate", _champion_header(table), "change", "gates"]
    body = [[row.metric, _number(row.candidate), _number(row.champion), _number(row.change, signed=True),
             _verdicts(row)] for row in table.rows]
    if table.baseline_model is not None:
        # Before the verdicts: the gates column is the widest.
        header.insert(4, f"baseline ({table.baseline_model})")
        for line, row in zip(body, table.rows, strict=True):
            line.insert(4, _number(row.baseline))
    return header, body


def as_text(table: GateTable) -> str:
    """Fixed-width columns, for logs and error messages."""
    header, body = _cells(table)
    widths = [max(len(line[i]) for line in [header, *body]) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
                     for line in [header, *body])


def as_markdown(table: GateTable) -> str:
    header, body = _cells(table)

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"

    return "\n".join([line(header), "| " + " | ".join("---" for _ in header) + " |", *(line(r) for r in body)])


def as_html(table: GateTable) -> str:
    header, body = _cells(table)
    head = "".join(f"<th align=\"left\">{html.escape(cell)}</th>" for cell in header)
    rows = "".join("<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in row) + "</tr>" for row in body)
    return f"<table border=\"1\" cellpadding=\"4\" cellspacing=\"0\"><tr>{head}</tr>{rows}</table>"


def summary(table: GateTable, *, consequence: str) -> str:
    """One line: which gates failed and with which values, then what happened (``consequence``)."""
    failed = table.failed
    if not failed:
        return f"gates passed ({table.gate_count}); {consequence}"
    return f"gates failed ({len(failed)} of {table.gate_count}): {'; '.join(map(_failure, failed))}; {consequence}"


def _failure(failed: tuple[MetricRow, GateVerdict]) -> str:
    row, verdict = failed
    value = verdict.value if verdict.value is not None else row.candidate
    if value is None:
        # The check of the champion's classes: its message alone, whole ("new 'x'; missing 'y'").
        return f"{verdict.gate} ({verdict.note})"
    return (f"{verdict.gate} (got {_number(value)}"
            f"{', ' + verdict.note.replace('; ', ', ') if verdict.note else ''})")
