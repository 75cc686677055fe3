"""trainpipe_trainer.tracking.progress: the line the Airflow task log shows."""

from __future__ import annotations

import re
import time

import pytest

from trainpipe_trainer.tracking.progress import Progress, format_duration


def test_progress_line_format(capsys: pytest.CaptureFixture[str]) -> None:
    progress = Progress(total_steps=600, epochs=3, enabled=True)
    progress.start(100)
    progress.add_samples(5120)
    progress.report(step=120, epoch=0, loss=0.23449)
    line = capsys.readouterr().out.strip()
    assert re.fullmatch(r"step 120/600 epoch 1/3 loss 0\.2345 samples/s \d+ data wait \d+% eta \S+", line), line


def test_the_line_shares_the_interval_between_waiting_for_data_and_computing(
    capsys: pytest.CaptureFixture[str],
) -> None:
    progress = Progress(total_steps=600, epochs=3, enabled=True)
    progress.start(0)
    time.sleep(0.2)
    progress.add_samples(1000)
    # The loader's running total: 0.1 s of the 0.2 s interval was spent waiting for batches.
    rate = progress.report(step=10, epoch=0, loss=1.0, data_wait_seconds=0.1, peak_memory_gb=2.5)
    assert 0.2 <= rate.data_wait_share <= 0.5
    assert 1000 / 0.4 < rate.samples_per_second <= 1000 / 0.2
    line = capsys.readouterr().out
    assert re.search(r"data wait (2\d|3\d|4\d|50)% gpu peak 2\.5 GiB eta", line), line
    # The next interval counts only its own waiting.
    time.sleep(0.1)
    assert progress.report(step=20, epoch=0, loss=1.0, data_wait_seconds=0.1).data_wait_share == 0.0


def test_disabled_progress_prints_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    progress = Progress(total_steps=10, epochs=1, enabled=False)
    progress.start(0)
    progress.report(step=5, epoch=0, loss=1.0)
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize(("seconds", "text"), [(12.4, "12s"), (125, "2m05s"), (7260, "2h01m")])
def test_format_duration(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text
