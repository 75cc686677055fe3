"""The DAG run's note: a one-line outcome a person sees in the run list and on the run page.

Airflow 3 gives a task no way to set its run's note (the task SDK talks to the execution API, which has no
such route, and task processes have no database access), and DAG callbacks run in the DAG processor under the
same restriction. So a task leaves its line as an XCom under ``RUN_NOTE_KEY``, and trainpipe's listener
(``trainpipe.listeners.run_notes``, loaded by the scheduler through the provider's plugin) writes the lines
into the note when the run ends, in the scheduler's own session: no credentials, no REST call.

The wording is stable: a note's first line is the run's reason, ``<outcome>: <facts>``, with one of the
outcomes in ``OUTCOMES`` (a fleet page can show the first line, and split it at the first ``": "``). The lines
are composed here (Airflow-free) so that every step words its facts the same way.
"""

from __future__ import annotations

import re
from typing import Any

RUN_NOTE_KEY = "trainpipe_run_note"

# The first words of every line trainpipe writes, in the order a run meets them.
VALIDATION_FAILED = "validation failed"
TRAINING_FAILED = "training failed"
TRAINING_STALLED = "training stalled"
GATES_FAILED = "gates failed"  # followed by " (n of m)"
APPROVAL_REJECTED = "approval rejected"
APPROVAL_TIMED_OUT = "approval timed out"
PROMOTED = "promoted"
BACKTEST = "backtest"  # followed by " for <window>"
INPUTS_UNCHANGED = "inputs unchanged"  # followed by " since version N (trained <date>)"
WEIGHTS_UNCHANGED = "weights unchanged"
FAILED_AT = "failed at"  # the listener's own line, for a failure no step explained
OUTCOMES = (VALIDATION_FAILED, TRAINING_FAILED, TRAINING_STALLED, GATES_FAILED, APPROVAL_REJECTED,
            APPROVAL_TIMED_OUT, PROMOTED, BACKTEST, INPUTS_UNCHANGED, WEIGHTS_UNCHANGED, FAILED_AT)
# Airflow's limit on a note's length (dag_run_note.content is a String(1000)).
NOTE_MAX_CHARS = 1000


def leave_note(ti: Any, line: str) -> None:
    """From a task: ``line`` becomes part of the run's note when the run ends."""
    ti.xcom_push(key=RUN_NOTE_KEY, value=line)


def is_outcome_line(line: str) -> bool:
    return any(line.startswith(outcome) and line[len(outcome):len(outcome) + 1] in (":", " ") for outcome in OUTCOMES)


def merged_note(existing: str | None, lines: list[str]) -> str | None:
    """The note with trainpipe's lines appended once each (a person's own note is kept, first); of
    trainpipe's lines the outcome comes first (the run's reason), then the others (cost, ...) in order."""
    kept = [line for line in (existing or "").splitlines() if line.strip()]
    for line in sorted(lines, key=lambda text: not is_outcome_line(text)):
        if line and line not in kept:
            kept.append(line)
    if not kept:
        return existing
    note = "\n".join(kept)
    return note if len(note) <= NOTE_MAX_CHARS else note[: NOTE_MAX_CHARS - 1] + "…"


def validation_note(parts: list[str]) -> str:
    """``validation failed: drift in amount (PSI 6.84 >= 0.25); row count 3000 -> 1200 (-60.0%, limit 50%)``"""
    return f"{VALIDATION_FAILED}: " + "; ".join(parts)


def training_note(reasons: tuple[str, ...] | list[str], *, fallback: str, try_number: int, tries: int) -> str:
    """The trainer's reason in a few words: NaN guard at step N, preempted (too often), out of memory.

    ``reasons`` are the trainer's one-line messages (``TrainingFailedError.reasons``); ``fallback`` is the
    error's text when the trainer gave none (a crash); ``tries`` is how many tries the task has in all.
    """
    texts = list(reasons) or [fallback]
    facts: list[str] = []
    for text in texts:
        fact = _training_fact(text, last_try=try_number >= tries, try_number=try_number)
        if fact not in facts:
            facts.append(fact)
    return f"{TRAINING_FAILED}: " + "; ".join(facts)


def preempted_leaving(step: int | None) -> str:
    """A try whose launcher was sent SIGTERM (its task or host going away): it left after the trainer's commit,
    not relaunched in place. The training error's reason, so ``training_note`` words the note with it as is."""
    if step is None:
        return "preempted before its first committed step; the next try resumes from the newest checkpoint"
    return f"preempted at step {step}; the next try resumes there"


def retry_note(try_number: int, changes: tuple[str, ...] | list[str]) -> str:
    """What a try asks of the cluster that the first did not (``trainpipe.kubernetes.tries``):
    ``try 2 changed: memory 16Gi -> 24Gi, limit 16Gi -> 24Gi after 1 OOM kill (OOMKilled) (on_oom: ...)``."""
    return f"try {try_number} changed: " + "; ".join(changes)


_NAN = re.compile(r"^(?P<what>non-finite (?:loss|gradient norm) \([^)]*\)) at step (?P<step>\d+)")
_PREEMPTED = re.compile(r"^received (?P<signal>\w+): committed checkpoint step-(?P<step>\d+)")
_OOM = re.compile(r"out of memory|OutOfMemoryError|OOMKilled|exit code 137\b|exitcode\s*:\s*-9\b|Signal 9 \(SIGKILL\)",
                  re.IGNORECASE)


def _training_fact(text: str, *, last_try: bool, try_number: int) -> str:
    if match := _NAN.match(text):
        return f"NaN guard at step {match['step']} ({match['what']})"
    if match := _PREEMPTED.match(text):
        if last_try:
            return f"preempted too often ({try_number} tries; the last at step {match['step']}, {match['signal']})"
        return f"preempted at step {match['step']} ({match['signal']}); the retry resumes there"
    if _OOM.search(text):
        return f"out of memory ({_first_line(text)})"
    return _first_line(text)


def _first_line(text: str, limit: int = 300) -> str:
    line = (text.strip().splitlines() or [""])[0]
    return line if len(line) <= limit else line[: limit - 1] + "…"


def stall_note(message: str) -> str:
    """From the checkpoint sensor's stall message (``training stalled: no checkpoint committed for ...``):
    the facts, without the advice that follows them."""
    facts = message.split(". ", 1)[0].removeprefix(f"{TRAINING_STALLED}: ")
    return f"{TRAINING_STALLED}: {facts}"


def below_baseline_note(baseline_model: str, rows: list[tuple[str, float, float]]) -> str:
    """A candidate that does worse than the evaluation's baseline model, said even when no gate names it:
    ``below baseline (ridge): rmse 70.120000 vs 65.300000; r2 0.410000 vs 0.500000``"""
    return f"below baseline ({baseline_model}): " + "; ".join(
        f"{metric} {value:.6f} vs {reference:.6f}" for metric, value, reference in rows)


def promotion_note(*, model_name: str, version: str | int, alias: str, metric: str | None,
                   value: float | None, champion_value: float | None, champion_version: int | None,
                   approved_by: str | None = None) -> str:
    """``promoted: fraud_detector version 4 is champion; auc 0.912345 vs 0.887654 of version 3 (+0.024691)``"""
    line = f"{PROMOTED}: {model_name} version {version} is {alias}"
    if metric is not None and value is not None:
        if champion_version is None:
            line += f"; {metric} {value:.6f} (no previous {alias})"
        elif champion_value is None:
            line += f"; {metric} {value:.6f} (version {champion_version} has no {metric})"
        else:
            line += (f"; {metric} {value:.6f} vs {champion_value:.6f} of version {champion_version} "
                     f"({value - champion_value:+.6f})")
    if approved_by:
        line += f"; approved by {approved_by}"
    return line


def approval_note(*, model_name: str, version: str | int, at: str | None, challenger_alias: str,
                  rejected_by: str | None = None, waited: str | None = None) -> str:
    """``approval rejected: fraud_detector version 4 by alice at 2026-07-01T10:00:00+00:00; it stays challenger``
    or, with ``waited`` (no answer; ``on_timeout: reject``), ``approval timed out: ... no answer within 1h ...``."""
    when = f" at {at}" if at else ""
    if waited is not None:
        return (f"{APPROVAL_TIMED_OUT}: {model_name} version {version}: no answer within {waited}{when} "
                f"(on_timeout: reject); it stays {challenger_alias}")
    return f"{APPROVAL_REJECTED}: {model_name} version {version} by {rejected_by}{when}; it stays {challenger_alias}"


def backtest_note(window: str, *, registered: str | None = None) -> str:
    """``backtest for 2026-10-07..2026-11-06: not promoted (run for a past window)``; with ``registered``
    (``fraud_detector version 5``), the version it was registered as follows."""
    line = f"{BACKTEST} for {window}: not promoted (run for a past window)"
    return f"{line}; registered as {registered}" if registered else line


def inputs_unchanged_note(*, version: int, trained_at: str) -> str:
    """``inputs unchanged since version 3 (trained 2026-11-26): nothing trained``"""
    return f"{INPUTS_UNCHANGED} since version {version} (trained {trained_at[:10]}): nothing trained"


def weights_unchanged_note(*, model_name: str, version: int, alias: str) -> str:
    """``weights unchanged: identical to fraud_detector version 3 (champion); nothing registered``"""
    return f"{WEIGHTS_UNCHANGED}: identical to {model_name} version {version} ({alias}); nothing registered"


def failed_at_note(task_ids: list[str]) -> str:
    """The listener's line for a failed run whose steps left none: where to look."""
    return f"{FAILED_AT}: {', '.join(task_ids)} (see the task log)"
