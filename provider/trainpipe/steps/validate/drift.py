"""Schema and distribution drift between two dataset versions (the baseline and a new snapshot).

* Schema: a version's schema is its ordered ``(column, dtype)`` list; ``schema_hash`` is the
  SHA-256 of it. :func:`schema_diff` lists added, removed and retyped columns; :func:`schema_violations`
  judges them against ``validation.schema`` (a removed or retyped column the pipeline uses is never
  allowed).
* Distribution: per feature, the population stability index (PSI) over bins taken from the
  reference and, for numeric features, the two-sample Kolmogorov-Smirnov statistic
  (``scipy.stats.ks_2samp``). Bins: a numeric feature with more distinct reference values than
  ``bins`` is cut at the reference's quantiles; one with fewer (a flag, a count) and a categorical
  (string, bool, category) feature get one bin per reference value. Missing values have a bin of
  their own, and values the reference never had (a new category, a flag that became 0.3) fall in an
  "other" bin, so both show up as drift. A text feature (every text unique: one bin per value would
  drift on every new version) is compared on its number of words per row, as a numeric feature.

PSI = sum over bins of ``(p_new - p_ref) * ln(p_new / p_ref)``, each share floored at
:data:`PSI_FLOOR` so that an empty bin counts as a large change instead of an infinite one.

numpy, pandas and scipy are imported inside the functions, so importing this module is cheap.
"""

from __future__ import annotations

import hashlib
import html
import json
import math
import re
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from itertools import pairwise
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

    from trainpipe.plan.model import DriftPlan, SchemaPolicy

# Shares below this count as this: an emptied or new bin gives a large, finite PSI term.
PSI_FLOOR = 1e-4
MISSING_BIN = "<missing>"
OTHER_BIN = "<other>"
Verdict = Literal["pass", "warn", "fail"]
# What a text feature's statistics measure, as the report names it.
TEXT_MEASURE = "words per row"
_VERDICT_ORDER = {"pass": 0, "warn": 1, "fail": 2}


# ---------------------------------------------------------------------------------------------
# schema


def frame_schema(frame: pd.DataFrame) -> list[tuple[str, str]]:
    """The ordered ``(column, dtype)`` pairs of a frame, dtypes as pandas names them."""
    return [(str(column), str(dtype)) for column, dtype in frame.dtypes.items()]


def schema_hash(schema: Sequence[Sequence[str]]) -> str:
    """SHA-256 of the ordered column names and types (as compact JSON ``[[name, type], ...]``)."""
    text = json.dumps([[str(name), str(kind)] for name, kind in schema], separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True, slots=True, kw_only=True)
class SchemaDiff:
    added: tuple[tuple[str, str], ...] = ()
    removed: tuple[tuple[str, str], ...] = ()
    # (column, type in the reference, type now)
    retyped: tuple[tuple[str, str, str], ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.added or self.removed or self.retyped)

    def lines(self) -> list[str]:
        """A diff: ``+ column: type``, ``- column: type``, ``~ column: old -> new``."""
        return [
            *(f"+ {name}: {kind}" for name, kind in self.added),
            *(f"- {name}: {kind}" for name, kind in self.removed),
            *(f"~ {name}: {old} -> {new}" for name, old, new in self.retyped),
        ]

    def to_dict(self) -> dict[str, Any]:
        return {"added": [list(a) for a in self.added], "removed": [list(r) for r in self.removed],
                "retyped": [list(r) for r in self.retyped]}


def schema_diff(reference: Sequence[Sequence[str]], current: Sequence[Sequence[str]]) -> SchemaDiff:
    """Columns added, removed and retyped going from ``reference`` to ``current`` (order ignored)."""
    old = {str(name): str(kind) for name, kind in reference}
    new = {str(name): str(kind) for name, kind in current}
    return SchemaDiff(
        added=tuple((name, kind) for name, kind in new.items() if name not in old),
        removed=tuple((name, kind) for name, kind in old.items() if name not in new),
        retyped=tuple((name, old[name], kind) for name, kind in new.items() if name in old and old[name] != kind),
    )


def schema_violations(diff: SchemaDiff, policy: SchemaPolicy) -> tuple[list[str], list[str]]:
    """``(failures, warnings)``: one line per change the policy does not allow, or only warns about.

    A removed or retyped column the pipeline uses (``policy.used_columns``) always fails.
    """
    failures: list[str] = []
    warnings: list[str] = []
    used = set(policy.used_columns)

    def judge(rule: str, line: str, column: str) -> None:
        if column in used and rule != "added_columns":
            failures.append(f"{line} (a column the pipeline uses; never allowed)")
            return
        action = getattr(policy, rule)
        if action == "fail":
            failures.append(f"{line} (validation.schema.{rule}: fail)")
        elif action == "warn":
            warnings.append(f"{line} (validation.schema.{rule}: warn)")

    for name, kind in diff.added:
        judge("added_columns", f"+ {name}: {kind}", name)
    for name, kind in diff.removed:
        judge("removed_columns", f"- {name}: {kind}", name)
    for name, old, new in diff.retyped:
        judge("retyped_columns", f"~ {name}: {old} -> {new}", name)
    return failures, warnings


# ---------------------------------------------------------------------------------------------
# statistics


def psi(reference_shares: Sequence[float], current_shares: Sequence[float], *, floor: float = PSI_FLOOR) -> float:
    """Population stability index of two share vectors over the same bins."""
    import numpy as np

    expected = np.maximum(np.asarray(reference_shares, dtype=float), floor)
    actual = np.maximum(np.asarray(current_shares, dtype=float), floor)
    if expected.shape != actual.shape:
        raise ValueError(f"PSI needs shares over the same bins, got {expected.shape} and {actual.shape}")
    return float(np.sum((actual - expected) * np.log(actual / expected)))


def is_numeric(series: pd.Series) -> bool:
    """Numbers are numeric; bool, strings and categoricals are categorical."""
    import pandas as pd

    return bool(pd.api.types.is_numeric_dtype(series) and not pd.api.types.is_bool_dtype(series))


@dataclass(frozen=True, slots=True, kw_only=True)
class Binning:
    """How a feature's values are put in bins: quantile edges (numeric) or the reference's values."""

    kind: Literal["quantiles", "values"]
    # kind "quantiles": the inner cut points; bin i holds edges[i-1] < x <= edges[i].
    edges: tuple[float, ...] = ()
    # kind "values": one bin per reference value.
    values: tuple[Any, ...] = ()

    def labels(self) -> list[str]:
        if self.kind == "quantiles":
            bounds = ["-inf", *(f"{edge:.6g}" for edge in self.edges), "inf"]
            return [f"({low}, {high}]" for low, high in pairwise(bounds)] + [MISSING_BIN]
        return [str(value) for value in self.values] + [OTHER_BIN, MISSING_BIN]

    def shares(self, series: pd.Series) -> np.ndarray:
        """The share of ``series`` in each bin, missing values included (last bin)."""
        import numpy as np

        total = len(series)
        if total == 0:
            return np.zeros(len(self.labels()))
        missing = series.isna().to_numpy()
        present = series[~missing]
        if self.kind == "quantiles":
            index = np.searchsorted(np.asarray(self.edges, dtype=float), present.to_numpy(dtype=float), side="left")
            counts = np.bincount(index, minlength=len(self.edges) + 1).astype(float)
        else:
            positions = {value: i for i, value in enumerate(self.values)}
            index = np.fromiter((positions.get(value, len(self.values)) for value in present.tolist()),
                                dtype=np.int64, count=len(present))
            counts = np.bincount(index, minlength=len(self.values) + 1).astype(float)
        return np.append(counts, float(missing.sum())) / total


def binning_for(reference: pd.Series, *, bins: int) -> Binning:
    """Bins from the reference: quantile cuts for a numeric feature with more than ``bins``
    distinct values, else one bin per distinct value (sorted)."""
    import numpy as np

    present = reference.dropna()
    distinct = present.unique()
    if is_numeric(reference) and len(distinct) > bins:
        cuts = np.quantile(present.to_numpy(dtype=float), np.linspace(0, 1, bins + 1)[1:-1])
        return Binning(kind="quantiles", edges=tuple(float(c) for c in np.unique(cuts)))
    try:
        ordered = sorted(distinct.tolist())
    except TypeError:  # mixed types: keep them in order of appearance
        ordered = list(distinct.tolist())
    return Binning(kind="values", values=tuple(ordered))


def words_per_row(series: pd.Series) -> pd.Series:
    """A text column as the number of words (runs of letters, digits or _) in each row; missing stays missing."""
    return series.astype("string").str.count(r"\w+").astype(float)


@dataclass(frozen=True, slots=True, kw_only=True)
class FeatureDrift:
    feature: str
    # text: the statistics are of its words per row (TEXT_MEASURE).
    kind: Literal["numeric", "categorical", "text"]
    psi: float | None
    ks: float | None
    ks_pvalue: float | None
    verdict: Verdict
    # Why: "psi 0.43 >= fail 0.25", one entry per threshold crossed.
    reasons: tuple[str, ...] = ()
    # For the report: bin label -> (reference share, current share).
    bins: tuple[tuple[str, float, float], ...] = field(default=(), repr=False)
    # Compared on a sample: the KS statistic two samples of these sizes exceed 5% of the time when drawn from
    # one distribution (1.36 * sqrt((n + m) / (n * m)), non-missing values); None when both sides were whole.
    ks_critical: float | None = None

    @property
    def shown_kind(self) -> str:
        return f"text ({TEXT_MEASURE})" if self.kind == "text" else self.kind

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["bins"] = [list(b) for b in self.bins]
        if self.ks_critical is None:
            del out["ks_critical"]  # a whole-version comparison reads as it always did
        return out


def _ks(reference: pd.Series, current: pd.Series) -> tuple[float | None, float | None]:
    from scipy.stats import ks_2samp

    ref, cur = reference.dropna().to_numpy(dtype=float), current.dropna().to_numpy(dtype=float)
    if len(ref) == 0 or len(cur) == 0:
        return None, None
    with warnings.catch_warnings():
        # With many ties (a flag) the exact p-value falls back to the asymptotic one; the statistic is the same.
        warnings.filterwarnings("ignore", message="ks_2samp: Exact calculation unsuccessful", category=RuntimeWarning)
        result = ks_2samp(ref, cur)
    return float(result.statistic), float(result.pvalue)


def _verdict(value: float | None, statistic: str, levels: Any) -> tuple[Verdict, str | None]:
    """``levels`` has ``warn`` and ``fail`` (either may be None); a value at or above a level crosses it."""
    if value is None or levels is None:
        return "pass", None
    if levels.fail is not None and value >= levels.fail:
        return "fail", f"{statistic} {value:.4f} >= fail {levels.fail:g}"
    if levels.warn is not None and value >= levels.warn:
        return "warn", f"{statistic} {value:.4f} >= warn {levels.warn:g}"
    return "pass", None


def ks_critical_value(n: int, m: int) -> float | None:
    """The two-sample KS statistic's 95% critical value for sizes ``n`` and ``m`` (asymptotic): below it, a
    difference is within what sampling alone gives."""
    return 1.36 * math.sqrt((n + m) / (n * m)) if n and m else None


def feature_drift(feature: str, reference: pd.Series, current: pd.Series, *, bins: int,
                  psi_levels: Any = None, ks_levels: Any = None, text: bool = False,
                  sampled: bool = False) -> FeatureDrift:
    """PSI (and KS for a numeric feature) of ``current`` against ``reference``, judged by the levels
    (objects with ``warn`` and ``fail``, or None for no judgement). ``text``: of their words per row.
    ``sampled``: either side is a sample, and the feature records its KS critical value."""
    if text:
        reference, current = words_per_row(reference), words_per_row(current)
    numeric = is_numeric(reference) and is_numeric(current)
    binning = binning_for(reference, bins=bins)
    if binning.kind == "quantiles" and not is_numeric(current):
        # The reference was numeric and the column no longer is (a retype): compare as values.
        binning = binning_for(reference.astype(str).where(reference.notna()), bins=0)
        current = current.astype(str).where(current.notna())
    expected, actual = binning.shares(reference), binning.shares(current)
    psi_value = psi(expected, actual)
    ks_value, ks_p = _ks(reference, current) if numeric else (None, None)
    judged = [_verdict(psi_value, "psi", psi_levels), _verdict(ks_value, "ks", ks_levels)]
    verdict = max((v for v, _ in judged), key=_VERDICT_ORDER.__getitem__)
    return FeatureDrift(
        feature=feature, kind="text" if text else "numeric" if numeric else "categorical", psi=psi_value,
        ks=ks_value, ks_pvalue=ks_p,
        ks_critical=ks_critical_value(int(reference.notna().sum()), int(current.notna().sum()))
        if sampled and numeric else None,
        verdict=verdict, reasons=tuple(reason for _, reason in judged if reason),
        bins=tuple((label, float(e), float(a)) for label, e, a in zip(binning.labels(), expected, actual, strict=True)),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class DriftReport:
    reference_digest: str
    current_digest: str
    reference_rows: int
    current_rows: int
    features: tuple[FeatureDrift, ...]
    # Features of the plan missing from one side (the schema check reports them).
    skipped: tuple[str, ...] = ()
    # A side compared on a seeded uniform sample (a manifest version): the version's rows, of which
    # ``*_rows`` were compared. None: that side was compared whole.
    reference_total_rows: int | None = None
    current_total_rows: int | None = None
    bins: int | None = None

    @property
    def sampled(self) -> bool:
        return self.reference_total_rows is not None or self.current_total_rows is not None

    def sample_text(self) -> str:
        """What sampling costs in precision, for the log, the message and the report; "" when nothing was sampled."""
        if not self.sampled:
            return ""

        def side(name: str, rows: int, total: int | None) -> str:
            return f"{name} {rows} of {total} rows" if total is not None else f"{name} whole ({rows} rows)"

        critical = ks_critical_value(self.reference_rows, self.current_rows)
        text = (f"compared on seeded uniform samples: {side('reference', self.reference_rows, self.reference_total_rows)}, "
                f"{side('current', self.current_rows, self.current_total_rows)}; PSI over {self.bins} bins of these rows")
        if critical is not None:
            text += (f"; KS 95% critical value at these sizes {critical:.4f} (1.36*sqrt((n+m)/(n*m)); a KS below it "
                     "is within sampling error)")
        return text

    @property
    def verdict(self) -> Verdict:
        return max((f.verdict for f in self.features), key=_VERDICT_ORDER.__getitem__, default="pass")

    def failed(self) -> list[FeatureDrift]:
        return [f for f in self.features if f.verdict == "fail"]

    def warned(self) -> list[FeatureDrift]:
        return [f for f in self.features if f.verdict == "warn"]

    def table(self) -> str:
        """A fixed-width table, one row per feature: kind, PSI, KS, verdict and why."""
        header = ("feature", "kind", "psi", "ks", "verdict", "why")
        rows = [
            (f.feature, f.shown_kind, _number(f.psi), _number(f.ks), f.verdict.upper(), "; ".join(f.reasons))
            for f in self.features
        ]
        widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]
        lines = ["  ".join(str(cell).ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
                 for row in [header, *rows]]
        lines.insert(1, "  ".join("-" * width for width in widths))
        if self.skipped:
            lines.append(f"not compared (missing on one side): {', '.join(self.skipped)}")
        if self.sampled:
            lines.append(self.sample_text())
        return "\n".join(lines)

    def metrics(self) -> dict[str, float]:
        """MLflow metrics: ``drift_psi.<feature>``, ``drift_ks.<feature>`` (other characters of a feature's
        name as ``_``), and the maxima."""
        out: dict[str, float] = {}
        for f in self.features:
            # MLflow keys allow letters, digits and _ - . / and spaces only.
            key = re.sub(r"[^\w./ -]", "_", f.feature)
            if f.psi is not None:
                out[f"drift_psi.{key}"] = f.psi
            if f.ks is not None:
                out[f"drift_ks.{key}"] = f.ks
        psis = [f.psi for f in self.features if f.psi is not None]
        kss = [f.ks for f in self.features if f.ks is not None]
        if psis:
            out["drift_psi_max"] = max(psis)
        if kss:
            out["drift_ks_max"] = max(kss)
        return out

    def to_dict(self) -> dict[str, Any]:
        out = {"reference_digest": self.reference_digest, "current_digest": self.current_digest,
               "reference_rows": self.reference_rows, "current_rows": self.current_rows,
               "verdict": self.verdict, "skipped": list(self.skipped),
               "features": [f.to_dict() for f in self.features]}
        if self.sampled:
            out["sample"] = {"reference_total_rows": self.reference_total_rows,
                             "current_total_rows": self.current_total_rows, "bins": self.bins,
                             "ks_critical": ks_critical_value(self.reference_rows, self.current_rows),
                             "text": self.sample_text()}
        return out

    def html(self, *, title: str) -> str:
        """A self-contained HTML page: the summary table and, per feature, its bins' shares."""
        esc = html.escape
        colour = {"pass": "#dff5e1", "warn": "#fff3cd", "fail": "#f8d7da"}
        summary = "".join(
            f"<tr style='background:{colour[f.verdict]}'><td><a href='#{esc(f.feature)}'>{esc(f.feature)}</a></td>"
            f"<td>{f.shown_kind}</td><td>{_number(f.psi)}</td><td>{_number(f.ks)}</td><td>{_number(f.ks_pvalue)}</td>"
            f"<td>{f.verdict.upper()}</td><td>{esc('; '.join(f.reasons))}</td></tr>"
            for f in self.features
        )
        details = []
        for f in self.features:
            rows = "".join(
                f"<tr><td>{esc(label)}</td><td>{ref:.4f}</td><td>{cur:.4f}</td>"
                f"<td><div style='background:#8fb3de;height:8px;width:{200 * ref:.0f}px'></div>"
                f"<div style='background:#e07b39;height:8px;width:{200 * cur:.0f}px'></div></td></tr>"
                for label, ref, cur in f.bins
            )
            details.append(f"<h3 id='{esc(f.feature)}'>{esc(f.feature)} ({f.shown_kind})</h3>"
                           "<table><tr><th>bin</th><th>reference share</th><th>current share</th><th></th></tr>"
                           f"{rows}</table>")
        skipped = f"<p>Not compared (missing on one side): {esc(', '.join(self.skipped))}</p>" if self.skipped else ""
        if self.sampled:
            skipped += f"<p>Sampling: {esc(self.sample_text())}.</p>"
        return (
            "<!doctype html><html><head><meta charset='utf-8'>"
            f"<title>{esc(title)}</title><style>body{{font-family:sans-serif}}"
            "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:2px 6px;text-align:left}</style>"
            f"</head><body><h1>{esc(title)}</h1>"
            f"<p>Reference version {esc(self.reference_digest[:16])} ({self.reference_rows} rows), current version "
            f"{esc(self.current_digest[:16])} ({self.current_rows} rows). Overall: <b>{self.verdict.upper()}</b>. "
            "PSI over bins from the reference (quantiles, or its values; missing and unseen values in bins of "
            f"their own; shares floored at {PSI_FLOOR:g}); KS: two-sample Kolmogorov-Smirnov statistic on "
            f"non-missing values of numeric features. A text feature is compared on its {TEXT_MEASURE}.</p>"
            "<table><tr><th>feature</th><th>kind</th><th>PSI</th><th>KS</th><th>KS p-value</th><th>verdict</th>"
            f"<th>why</th></tr>{summary}</table>{skipped}{''.join(details)}</body></html>"
        )


def _number(value: float | None) -> str:
    if value is None:
        return "-"
    return "inf" if math.isinf(value) else f"{value:.4f}"


def compare(reference: pd.DataFrame, current: pd.DataFrame, plan: DriftPlan, *, features: Iterable[str],
            reference_digest: str, current_digest: str, text_features: Iterable[str] = (),
            reference_total_rows: int | None = None, current_total_rows: int | None = None) -> DriftReport:
    """Every feature of ``features`` present in both frames, judged by the plan's thresholds; those of
    ``text_features`` on their words per row. ``*_total_rows``: that frame is a sample of a version of
    this many rows (the report states the sampling error)."""
    sampled = reference_total_rows is not None or current_total_rows is not None
    text = set(text_features)
    results = []
    skipped = []
    for feature in features:
        if feature not in reference.columns or feature not in current.columns:
            skipped.append(feature)
            continue
        levels = plan.levels_for(feature)
        if levels.ignore:
            continue
        results.append(feature_drift(feature, reference[feature], current[feature], bins=plan.bins,
                                     psi_levels=levels.psi, ks_levels=levels.ks, text=feature in text,
                                     sampled=sampled))
    return DriftReport(reference_digest=reference_digest, current_digest=current_digest,
                       reference_rows=len(reference), current_rows=len(current),
                       features=tuple(results), skipped=tuple(skipped),
                       reference_total_rows=reference_total_rows, current_total_rows=current_total_rows,
                       bins=plan.bins if sampled else None)


def _named(feature: FeatureDrift) -> str:
    """A feature as a message names it: a text feature by what was compared."""
    return f"{feature.feature}'s {TEXT_MEASURE}" if feature.kind == "text" else feature.feature


def note_text(report: DriftReport) -> str:
    """``drift in amount (PSI 6.84 >= 0.25, KS 0.512 >= 0.1)``: the run note's words for the failed features."""
    parts = []
    for feature in report.failed():
        crossed = []
        for reason in feature.reasons:
            statistic, value, _, level, threshold = reason.split()  # "psi 6.8400 >= fail 0.25"
            if level == "fail":
                crossed.append(f"{statistic.upper()} {float(value):.3g} >= {threshold}")
        parts.append(f"{_named(feature)} ({', '.join(crossed)})")
    return "drift in " + ", ".join(parts)


def failure_message(report: DriftReport) -> str:
    """``distribution drift in amount (psi 0.81 >= fail 0.25; ks ...), ...``"""
    parts = [f"{_named(f)} ({'; '.join(r for r in f.reasons if 'fail' in r)})" for f in report.failed()]
    sampled = f" ({report.sample_text()})" if report.sampled else ""
    return (f"distribution drift vs version {report.reference_digest[:16]} in " + ", ".join(parts) + sampled)


