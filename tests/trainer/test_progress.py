"""trainpipe_trainer.progress: the line the Airflow task log shows."""

from __future__ import annotations

import re

import pytest
from trainpipe_trainer.progress import Progress, format_duration


def test_progress_line_format(capsys: pytest.CaptureFixture[str]) -> None:
    progress = Progress(total_steps=600, epochs=3, enabled=True)
    progress.start(100)
    progress.add_samples(5120)
    progress.report(step=120, epoch=0, loss=0.23449)
    line = capsys.readouterr().out.strip()
    assert re.fullmatch(r"step 120/600 epoch 1/3 loss 0\.2345 samples/s \d+ eta \S+", line), line


def test_disabled_progress_prints_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    progress = Progress(total_steps=10, epochs=1, enabled=False)
    progress.start(0)
    progress.report(step=5, epoch=0, loss=1.0)
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize(("seconds", "text"), [(12.4, "12s"), (125, "2m05s"), (7260, "2h01m")])
def test_format_duration(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text
