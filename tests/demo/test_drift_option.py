"""`trainpipe demo-data --drift FEATURE` and the function behind it, trainpipe.demo.synthetic.drift_feature."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from trainpipe.commands.main import main
from trainpipe.demo.synthetic import drift_feature, generate_transactions
from trainpipe.errors import SpecError

END = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.fixture(scope="module")
def transactions() -> pd.DataFrame:
    return generate_transactions(rows=2000, end=END)


def test_numeric_feature_moves_by_one_standard_deviation(transactions):
    drifted = drift_feature(transactions, "amount")

    shift = drifted["amount"] - transactions["amount"]
    assert np.allclose(shift, transactions["amount"].std())
    # Nothing else changes, and the input is left alone.
    pd.testing.assert_frame_equal(drifted.drop(columns=["amount"]), transactions.drop(columns=["amount"]))
    assert not drifted["amount"].equals(transactions["amount"])


def test_categorical_feature_half_the_rows_take_the_rarest_category():
    frame = pd.DataFrame({"channel": ["web"] * 600 + ["pos"] * 300 + ["atm"] * 50 + [None] * 50})

    drifted = drift_feature(frame, "channel")

    unchanged = (drifted["channel"] == frame["channel"]) | (drifted["channel"].isna() & frame["channel"].isna())
    moved = ~unchanged
    assert set(drifted.loc[moved, "channel"]) == {"atm"}
    assert 0.4 < (drifted["channel"] == "atm").mean() < 0.6
    assert drifted["channel"].isna().sum() < frame["channel"].isna().sum()  # missing values move too
    assert drift_feature(frame, "channel").equals(drifted)  # deterministic


def test_unknown_column_is_refused(transactions):
    with pytest.raises(SpecError, match=r"--drift: 'amout' is not a column; columns are transaction_id, event_time, amount"):
        drift_feature(transactions, "amout")


def test_cli_writes_the_drifted_day(tmp_path: Path, capsys):
    assert main(["demo-data", "--out", str(tmp_path), "--end", "2026-01-01"]) == 0
    normal = pd.read_parquet(tmp_path / "transactions" / "transactions.parquet")
    capsys.readouterr()

    assert main(["demo-data", "--out", str(tmp_path), "--end", "2026-01-01", "--drift", "merchant_risk"]) == 1
    assert "already exists with different content" in capsys.readouterr().err
    assert main(["demo-data", "--out", str(tmp_path), "--end", "2026-01-01", "--drift", "merchant_risk", "--force"]) == 0

    assert "transactions: merchant_risk drifted" in capsys.readouterr().out
    drifted = pd.read_parquet(tmp_path / "transactions" / "transactions.parquet")
    assert np.allclose(drifted["merchant_risk"] - normal["merchant_risk"], normal["merchant_risk"].std())
    assert main(["demo-data", "--out", str(tmp_path), "--end", "2026-01-01", "--drift", "nope", "--force"]) == 1
    assert "'nope' is not a column" in capsys.readouterr().err
