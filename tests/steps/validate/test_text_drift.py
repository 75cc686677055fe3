"""Drift of a text feature: compared on its number of words per row (every text is unique, so one bin per value
would drift on every new version), and labelled so in the table, the page, the run note and the failure."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from trainpipe.plan.model import DriftLevels, DriftPlan
from trainpipe.steps.validate import drift

PLAN = DriftPlan(reference="baseline", bins=10, psi=DriftLevels(warn=0.1, fail=0.25),
                 ks=DriftLevels(warn=0.05, fail=0.1))
WORDS = ["the", "order", "came", "late", "great", "box", "thanks", "refund", "please", "ok"]


def _reviews(n: int, seed: int, *, mean_words: float) -> pd.DataFrame:
    """Unique texts (a serial number in each) with a Poisson number of words; a few missing."""
    rng = np.random.default_rng(seed)
    texts = [" ".join([f"#{seed}-{i}", *rng.choice(WORDS, rng.poisson(mean_words))]) for i in range(n)]
    frame = pd.DataFrame({"review": texts, "amount": rng.normal(100, 10, n)})
    frame.loc[rng.random(n) < 0.02, "review"] = None
    return frame


def test_words_per_row_counts_words_and_keeps_missing_missing():
    counts = drift.words_per_row(pd.Series(["Great box, thanks!", "", None, "naïve café_2 ok"]))
    assert counts.tolist()[:2] == [3.0, 0.0] and np.isnan(counts.iloc[2]) and counts.iloc[3] == 3.0


def test_unique_texts_of_the_same_length_do_not_drift():
    reference, current = _reviews(3000, 1, mean_words=8), _reviews(3000, 2, mean_words=8)
    # The texts of the two versions share no value: by value, every row would be "other".
    assert not set(reference["review"].dropna()) & set(current["review"].dropna())

    report = drift.compare(reference, current, PLAN, features=["review", "amount"], text_features=["review"],
                           reference_digest="r" * 64, current_digest="n" * 64)

    text = report.features[0]
    assert (text.feature, text.kind, text.verdict) == ("review", "text", "pass")
    assert text.psi < 0.05 and text.ks is not None
    # Bins are word-count quantiles (and missing), never one per text.
    assert len(text.bins) <= PLAN.bins + 1 and text.bins[-1][0] == drift.MISSING_BIN
    assert report.features[1].kind == "numeric"
    by_value = drift.feature_drift("review", reference["review"], current["review"], bins=10, psi_levels=PLAN.psi)
    assert by_value.verdict == "fail"  # what the text feature would get without the declaration


def test_texts_that_got_longer_drift_and_the_messages_say_what_was_compared():
    reference, current = _reviews(3000, 3, mean_words=8), _reviews(3000, 4, mean_words=16)

    report = drift.compare(reference, current, PLAN, features=["review"], text_features=["review"],
                           reference_digest="r" * 64, current_digest="n" * 64)

    [text] = report.failed()
    assert text.feature == "review" and text.kind == "text"
    assert report.table().splitlines()[2].split()[:4] == ["review", "text", "(words", "per"]
    assert "review (text (words per row))" in report.html(title="t")
    assert drift.note_text(report).startswith("drift in review's words per row (PSI ")
    assert "review's words per row (psi " in drift.failure_message(report)
    assert set(report.metrics()) >= {"drift_psi.review", "drift_ks.review"}


@pytest.mark.parametrize("declared", [(), ("review",)])
def test_validate_passes_the_plan_s_text_features_to_drift(monkeypatch, declared):
    """The validate step reads which features are text from its plan (training.transforms' type: text)."""
    from trainpipe.plan.model import SchemaPolicy, ValidationPlan
    from trainpipe.steps.validate import validate as step

    reference, current = _reviews(500, 5, mean_words=8), _reviews(500, 6, mean_words=8)
    monkeypatch.setattr(step, "_read_version_frame", lambda settings, uri: reference)
    plan = ValidationPlan(expectations=(), required_columns=("review",), max_volume_change=None,
                          schema=SchemaPolicy(), drift=PLAN, features=("review",), text_features=declared)
    snapshot = type("Snapshot", (), {"digest": "n" * 64})()

    report, _ = step._check_drift("reviews", plan, snapshot, current, {"digest": "r" * 64, "uri": "ref"},
                                  settings=None)  # type: ignore[arg-type]

    assert report.features[0].kind == ("text" if declared else "categorical")
