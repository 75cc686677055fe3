"""trainpipe.demo.synthetic: determinism, schema, learnability and safe writing."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import trainpipe
from trainpipe.demo.synthetic import (
    CLICK_FEATURES,
    DIGIT_FEATURES,
    MERCHANT_CATEGORIES,
    TICKET_QUEUES,
    TRANSACTION_CATEGORICAL_FEATURES,
    TRANSACTION_FEATURES,
    TRANSACTION_REGIONS,
    generate_clicks,
    generate_digits,
    generate_instructions,
    generate_tickets,
    generate_transactions,
    write_demo_data,
)
from trainpipe.errors import SpecError, StorageConflictError
from trainpipe.steps.evaluate.metrics import compute_metrics

END = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.fixture(scope="module")
def transactions() -> pd.DataFrame:
    return generate_transactions(end=END)


@pytest.fixture(scope="module")
def clicks() -> pd.DataFrame:
    return generate_clicks(end=END)


def _parquet_bytes(df: pd.DataFrame, path: Path) -> bytes:
    df.to_parquet(path, index=False)
    return path.read_bytes()


def test_transactions_are_deterministic(transactions: pd.DataFrame, tmp_path: Path) -> None:
    again = generate_transactions(end=END)
    pd.testing.assert_frame_equal(transactions, again)
    assert _parquet_bytes(transactions, tmp_path / "a.parquet") == _parquet_bytes(again, tmp_path / "b.parquet")
    other = generate_transactions(end=END, seed=8)
    assert not transactions.equals(other)
    assert not np.array_equal(transactions["amount"], other["amount"])


def test_clicks_are_deterministic(clicks: pd.DataFrame) -> None:
    pd.testing.assert_frame_equal(clicks, generate_clicks(end=END))
    assert not clicks.equals(generate_clicks(end=END, seed=12))


def test_naive_end_is_read_as_utc() -> None:
    naive = generate_transactions(rows=500, end=datetime(2026, 1, 1))
    pd.testing.assert_frame_equal(naive, generate_transactions(rows=500, end=END))


def test_transactions_schema(transactions: pd.DataFrame) -> None:
    assert list(transactions.columns) == ["transaction_id", "event_time", *TRANSACTION_FEATURES, "region",
                                          *TRANSACTION_CATEGORICAL_FEATURES, "is_fraud"]
    assert len(transactions) == 20_000
    assert transactions["transaction_id"].dtype == np.int64
    assert transactions["transaction_id"].is_unique
    assert str(transactions["event_time"].dt.tz) == "UTC"
    assert transactions["event_time"].is_monotonic_increasing
    assert transactions["event_time"].min() > pd.Timestamp(END - timedelta(days=60))
    assert transactions["event_time"].max() <= pd.Timestamp(END)
    for column in TRANSACTION_FEATURES:
        assert transactions[column].dtype == np.float64, column
        assert transactions[column].notna().all(), column
    assert (transactions["hour_of_day"] == transactions["event_time"].dt.hour).all()
    assert set(transactions["is_foreign"].unique()) == {0.0, 1.0}
    assert transactions["is_fraud"].dtype == np.int64
    assert set(transactions["is_fraud"].unique()) == {0, 1}
    assert (transactions["amount"] > 0).all()
    shares = transactions["region"].value_counts(normalize=True)
    assert set(shares.index) == set(TRANSACTION_REGIONS)
    assert shares.to_dict() == pytest.approx({"north": 0.4, "south": 0.3, "east": 0.2, "west": 0.1}, abs=0.02)


def test_merchant_category_is_text_with_missing_values_and_follows_risk(transactions: pd.DataFrame) -> None:
    category = transactions["merchant_category"]
    assert pd.api.types.is_string_dtype(category) or category.dtype == object
    assert set(category.dropna().unique()) == set(MERCHANT_CATEGORIES)
    assert 0.03 <= category.isna().mean() <= 0.05
    risk = transactions.groupby("merchant_category")["merchant_risk"].mean()
    assert risk["gift_cards"] > risk["grocery"] + 0.05


def test_merchant_category_leaves_the_other_columns_unchanged() -> None:
    # Drawn from its own random stream: the numeric features and the label did not move when it came.
    frame = generate_transactions(rows=2_000, end=END)
    digest = pd.util.hash_pandas_object(frame.drop(columns="merchant_category"), index=False).sum()
    assert int(digest) % 2**32 == _DIGEST_WITHOUT_CATEGORY


# pd.util.hash_pandas_object(...).sum() % 2**32 of generate_transactions(rows=2_000, end=END) without the
# category column, as the generator gave it before the column existed (commit 843ddc0).
_DIGEST_WITHOUT_CATEGORY = 975775610


@pytest.mark.parametrize("seed", [7, 1, 2, 3])
def test_fraud_rate_in_range(seed: int) -> None:
    rate = generate_transactions(end=END, seed=seed)["is_fraud"].mean()
    assert 0.05 <= rate <= 0.10


def test_rows_and_days_are_respected() -> None:
    small = generate_transactions(rows=100, days=3, end=END)
    assert len(small) == 100
    assert small["event_time"].min() > pd.Timestamp(END - timedelta(days=3))


def test_invalid_sizes_are_spec_errors() -> None:
    with pytest.raises(SpecError, match="rows: must be a positive integer, got 0"):
        generate_transactions(rows=0, end=END)
    with pytest.raises(SpecError, match="docs_per_query: must be a positive integer, got -1"):
        generate_clicks(docs_per_query=-1, end=END)
    with pytest.raises(SpecError, match="end: expected a datetime, got str"):
        generate_clicks(end="2026-01-01")  # type: ignore[arg-type]


def test_clicks_schema(clicks: pd.DataFrame) -> None:
    assert list(clicks.columns) == ["query_id", "doc_id", "event_time", *CLICK_FEATURES, "relevance"]
    assert len(clicks) == 1_500 * 20
    assert clicks["query_id"].dtype == np.int64
    assert clicks["doc_id"].dtype == np.int64
    assert clicks["relevance"].dtype == np.int64
    assert set(clicks["relevance"].unique()) == {0, 1, 2, 3, 4}
    per_query = clicks.groupby("query_id")
    assert (per_query.size() == 20).all()
    assert (per_query["doc_id"].nunique() == 20).all()
    assert (per_query["event_time"].nunique() == 1).all()
    assert str(clicks["event_time"].dt.tz) == "UTC"
    assert clicks["event_time"].min() > pd.Timestamp(END - timedelta(days=60))
    assert clicks["event_time"].max() <= pd.Timestamp(END)
    for column in CLICK_FEATURES:
        assert clicks[column].dtype == np.float64, column
    assert sorted(per_query.get_group(1)["position_prior"]) == list(range(1, 21))


def test_fraud_signal_is_learnable_and_non_linear(transactions: pd.DataFrame) -> None:
    from sklearn.ensemble import HistGradientBoostingClassifier
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import roc_auc_score
    from sklearn.model_selection import train_test_split
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    x = transactions[list(TRANSACTION_FEATURES)].to_numpy()
    y = transactions["is_fraud"].to_numpy()
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.3, random_state=0, stratify=y)
    trees = HistGradientBoostingClassifier(max_iter=60, random_state=0).fit(x_train, y_train)
    linear = make_pipeline(StandardScaler(), LogisticRegression(max_iter=1000)).fit(x_train, y_train)
    trees_auc = roc_auc_score(y_test, trees.predict_proba(x_test)[:, 1])
    linear_auc = roc_auc_score(y_test, linear.predict_proba(x_test)[:, 1])
    assert trees_auc > 0.9
    assert linear_auc > 0.8
    assert trees_auc - linear_auc > 0.05  # the signal is in interactions a linear model misses


def test_click_relevance_is_learnable(clicks: pd.DataFrame) -> None:
    from sklearn.ensemble import HistGradientBoostingRegressor

    train = clicks["query_id"] <= 1_000
    test = clicks[~train]
    model = HistGradientBoostingRegressor(max_iter=50, random_state=0)
    model.fit(clicks.loc[train, list(CLICK_FEATURES)], clicks.loc[train, "relevance"])

    def ndcg(scores: np.ndarray) -> float:
        return compute_metrics(
            "ranking", ["ndcg@10"], y_true=test["relevance"], y_score=scores, groups=test["query_id"]
        )["ndcg@10"]

    model_ndcg = ndcg(model.predict(test[list(CLICK_FEATURES)]))
    random_ndcg = ndcg(np.random.default_rng(0).random(len(test)))
    assert random_ndcg < 0.5
    assert model_ndcg > random_ndcg + 0.3


def test_write_demo_data_round_trips_and_is_idempotent(tmp_path: Path) -> None:
    paths = write_demo_data(tmp_path, end=END)
    assert paths == {
        "transactions": str(tmp_path / "transactions" / "transactions.parquet"),
        "clicks": str(tmp_path / "clicks" / "clicks.parquet"),
        "digits": str(tmp_path / "digits" / "digits.parquet"),
        "tickets": str(tmp_path / "tickets" / "tickets.parquet"),
        "instructions": str(tmp_path / "instructions" / "instructions.parquet"),
        "tiny-lm": str(tmp_path / "models" / "tiny-lm"),
    }
    pd.testing.assert_frame_equal(pd.read_parquet(paths["transactions"]), generate_transactions(end=END))
    pd.testing.assert_frame_equal(pd.read_parquet(paths["clicks"]), generate_clicks(end=END))
    pd.testing.assert_frame_equal(pd.read_parquet(paths["digits"]), generate_digits(end=END))
    pd.testing.assert_frame_equal(pd.read_parquet(paths["tickets"]), generate_tickets(end=END))
    pd.testing.assert_frame_equal(pd.read_parquet(paths["instructions"]), generate_instructions(end=END))
    model_files = ["config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                   "tokenizer_config.json"]
    assert sorted(p.name for p in Path(paths["tiny-lm"]).iterdir()) == model_files

    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    stamps = {path: os.stat(path).st_mtime_ns for path in written}
    assert write_demo_data(str(tmp_path), end=END) == paths
    # The same bytes again (the model's weights and tokenizer included): nothing is rewritten.
    assert {path: os.stat(path).st_mtime_ns for path in written} == stamps
    assert sorted(p.name for p in tmp_path.rglob("*")) == sorted([
        "clicks", "clicks.parquet", "digits", "digits.parquet", "instructions", "instructions.parquet", "models",
        "tickets", "tickets.parquet", "tiny-lm", "transactions", "transactions.parquet", *model_files])


def test_the_instruction_pairs_ask_for_each_tickets_queue() -> None:
    tickets, instructions = generate_tickets(end=END), generate_instructions(end=END)
    assert len(instructions) == len(tickets)
    assert list(instructions.columns) == ["event_time", "prompt", "completion"]
    assert (instructions["completion"] == " " + tickets["queue"] + ".").all()
    assert all(prompt.startswith(f"Ticket: {subject}. ")
               for prompt, subject in zip(instructions["prompt"], tickets["subject"], strict=True))
    assert instructions["prompt"].str.endswith("\nWhich team handles it?").all()


def test_write_demo_data_refuses_different_content_without_force(tmp_path: Path) -> None:
    paths = write_demo_data(tmp_path, end=END)
    before = {name: Path(path).read_bytes() for name, path in paths.items() if Path(path).is_file()}
    later = END + timedelta(days=1)

    with pytest.raises(StorageConflictError, match=r"transactions\.parquet: already exists with different content; pass --force"):
        write_demo_data(tmp_path, end=later)
    assert {name: Path(path).read_bytes() for name, path in paths.items() if Path(path).is_file()} == before

    write_demo_data(tmp_path, end=later, force=True)
    pd.testing.assert_frame_equal(pd.read_parquet(paths["transactions"]), generate_transactions(end=later))
    pd.testing.assert_frame_equal(pd.read_parquet(paths["clicks"]), generate_clicks(end=later))


def test_write_demo_data_treats_a_non_parquet_file_as_different(tmp_path: Path) -> None:
    target = tmp_path / "clicks" / "clicks.parquet"
    target.parent.mkdir()
    target.write_text("not parquet")
    with pytest.raises(StorageConflictError, match="clicks.parquet: already exists"):
        write_demo_data(tmp_path, end=END)
    assert target.read_text() == "not parquet"
    assert not (tmp_path / "transactions").exists()


def _run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    provider_root = str(Path(trainpipe.__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": provider_root}
    return subprocess.run(
        [sys.executable, "-m", "trainpipe.demo.synthetic", *args], capture_output=True, text=True, env=env
    )


def test_cli_writes_then_skips_then_refuses(tmp_path: Path) -> None:
    first = _run_cli("--out", str(tmp_path), "--end", "2026-01-01")
    assert first.returncode == 0, first.stderr
    assert first.stdout.splitlines() == [
        f"written     transactions: {tmp_path / 'transactions' / 'transactions.parquet'} (20000 rows, end 2026-01-01)",
        f"written     clicks: {tmp_path / 'clicks' / 'clicks.parquet'} (30000 rows, end 2026-01-01)",
        f"written     digits: {tmp_path / 'digits' / 'digits.parquet'} (1797 rows, end 2026-01-01)",
        f"written     tickets: {tmp_path / 'tickets' / 'tickets.parquet'} (4000 rows, end 2026-01-01)",
        f"written     instructions: {tmp_path / 'instructions' / 'instructions.parquet'} (4000 rows, end 2026-01-01)",
        f"written     tiny-lm: {tmp_path / 'models' / 'tiny-lm'} (5 files)",
    ]
    pd.testing.assert_frame_equal(
        pd.read_parquet(tmp_path / "transactions" / "transactions.parquet"), generate_transactions(end=END)
    )

    second = _run_cli("--out", str(tmp_path), "--end", "2026-01-01")
    assert second.returncode == 0
    assert all(line.startswith("unchanged ") for line in second.stdout.splitlines())

    conflict = _run_cli("--out", str(tmp_path), "--end", "2026-01-02")
    assert conflict.returncode == 1
    assert "already exists with different content; pass --force" in conflict.stderr

    forced = _run_cli("--out", str(tmp_path), "--end", "2026-01-02", "--force")
    assert forced.returncode == 0
    *tables, model = forced.stdout.splitlines()
    assert all(line.startswith("overwritten ") for line in tables)
    # The tickets' words do not depend on the end date: the model trained on them is the same.
    assert model.startswith("unchanged   tiny-lm: ")


def test_cli_rejects_bad_end(tmp_path: Path) -> None:
    result = _run_cli("--out", str(tmp_path), "--end", "01/02/2026")
    assert result.returncode == 2
    assert "--end: expected YYYY-MM-DD, got '01/02/2026'" in result.stderr


def test_digits_are_scikit_learns_table_with_every_class_in_any_month() -> None:
    from sklearn.datasets import load_digits

    digits = generate_digits(end=END)
    pd.testing.assert_frame_equal(digits, generate_digits(end=END))
    assert list(digits.columns) == ["event_time", *DIGIT_FEATURES, "digit"]
    bundled = load_digits()
    # The same rows (in another order): the real table, not a look-alike.
    assert sorted(map(tuple, digits[list(DIGIT_FEATURES)].to_numpy())) == sorted(map(tuple, bundled.data))
    assert sorted(digits["digit"].tolist()) == sorted(bundled.target.tolist())
    month = digits[digits["event_time"] > pd.Timestamp(END - timedelta(days=30))]
    assert set(month["digit"]) == set(range(10))
    assert digits["event_time"].max() <= pd.Timestamp(END)


def test_tickets_are_deterministic_text_whose_words_tell_the_queue() -> None:
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import train_test_split
    from sklearn.pipeline import make_pipeline

    tickets = generate_tickets(end=END)
    pd.testing.assert_frame_equal(tickets, generate_tickets(end=END))
    assert list(tickets.columns) == ["event_time", "subject", "body", "channel", "queue"]
    assert set(tickets["queue"]) == set(TICKET_QUEUES)
    assert tickets["body"].str.split().str.len().between(8, 120).all()
    text = tickets["subject"] + " " + tickets["body"]
    train_text, test_text, train_queue, test_queue = train_test_split(
        text, tickets["queue"], test_size=0.3, random_state=0)
    words = make_pipeline(TfidfVectorizer(), LogisticRegression(max_iter=2000)).fit(train_text, train_queue)
    accuracy = float((words.predict(test_text) == test_queue).mean())
    # Learnable, and not trivially: about 3% of the queues are a triage team's mistakes.
    assert 0.85 < accuracy < 0.99, accuracy
