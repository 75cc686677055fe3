"""The wording of run notes (trainpipe.state.run_notes): the trainer's and the sensor's own messages in a few words."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from trainpipe.state.checkpoint_state import CheckpointState, TrainingStatus, assess
from trainpipe.state.run_notes import OUTCOMES, merged_note, promotion_note, stall_note, training_note

# As trainpipe_trainer prints them (trainer.py: _diverged, _stop_for_preemption).
NAN = ("non-finite loss (nan) at step 12: training stopped; the last checkpoint (step-10) is kept unchanged; "
       "lower learning_rate, set optimization.gradient_clip_norm or check the data")
PREEMPTED = "received SIGTERM: committed checkpoint step-40; exiting so that the next attempt resumes there"


def test_training_notes_name_the_guard_the_preemption_and_the_oom():
    assert training_note((NAN,), fallback="", try_number=1, tries=2) == \
        "training failed: NaN guard at step 12 (non-finite loss (nan))"
    assert training_note((PREEMPTED,), fallback="", try_number=1, tries=3) == \
        "training failed: preempted at step 40 (SIGTERM); the retry resumes there"
    assert training_note((PREEMPTED,), fallback="", try_number=3, tries=3) == \
        "training failed: preempted too often (3 tries; the last at step 40, SIGTERM)"
    oom = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
    assert training_note((oom,), fallback="", try_number=1, tries=1) == f"training failed: out of memory ({oom})"
    # No reason from the trainer (a crash): the error's first line.
    assert training_note((), fallback="trainer exited with code 1: torchrun ...\nmore", try_number=1, tries=1) == \
        "training failed: trainer exited with code 1: torchrun ..."


def test_the_stall_note_is_the_sensor_message_without_its_advice():
    now = datetime(2026, 7, 1, 12, tzinfo=UTC)
    status = TrainingStatus(state="running", try_number=1, final=False, started_at=now - timedelta(hours=2),
                            updated_at=now - timedelta(hours=2))
    state = CheckpointState(status=status, checkpoints=(), committed_count=0)
    progress = assess(state, now=now, stall_timeout=timedelta(hours=1))

    note = stall_note(progress.message)

    assert note == ("training stalled: no checkpoint committed for 2h00m (stall_timeout 1h00m); try 1 running; "
                    "no committed checkpoint yet")


def test_promotion_note_compares_the_main_metric_with_the_replaced_champion():
    assert promotion_note(model_name="m", version=4, alias="champion", metric="auc", value=0.9123456,
                          champion_value=0.8876543, champion_version=3, approved_by="alice") == \
        "promoted: m version 4 is champion; auc 0.912346 vs 0.887654 of version 3 (+0.024691); approved by alice"
    assert promotion_note(model_name="m", version=1, alias="champion", metric="auc", value=0.8,
                          champion_value=None, champion_version=None).endswith("auc 0.800000 (no previous champion)")


def test_every_note_starts_with_an_outcome():
    lines = [training_note((NAN,), fallback="", try_number=1, tries=1),
             promotion_note(model_name="m", version=1, alias="champion", metric=None, value=None,
                            champion_value=None, champion_version=None)]
    assert all(line.split(": ", 1)[0] in OUTCOMES for line in lines)


def test_the_issue_33_outcomes_lead_the_note():
    """Backtests, unchanged inputs and unchanged weights are reasons, worded as the docs give them (before the
    cost line in the note)."""
    from trainpipe.state.run_notes import backtest_note, inputs_unchanged_note, weights_unchanged_note

    lines = [backtest_note("2026-10-07..2026-11-06"),
             inputs_unchanged_note(version=3, trained_at="2026-11-26T04:00:00+00:00"),
             weights_unchanged_note(model_name="fraud_detector", version=3, alias="champion")]
    assert lines == ["backtest for 2026-10-07..2026-11-06: not promoted (run for a past window)",
                     "inputs unchanged since version 3 (trained 2026-11-26): nothing trained",
                     "weights unchanged: identical to fraud_detector version 3 (champion); nothing registered"]
    for line in lines:
        assert merged_note(None, ["training used 0 GPU-hours", line]).splitlines()[0] == line
    assert backtest_note("2026-10-07..2026-11-06", registered="m version 5 (alias backtest)").endswith(
        "(run for a past window); registered as m version 5 (alias backtest)")


def test_a_skipped_train_ends_the_watch_however_long_ago_it_started():
    now = datetime(2026, 7, 1, 12, tzinfo=UTC)
    status = TrainingStatus(state="skipped", try_number=1, final=True, started_at=now - timedelta(days=2),
                            updated_at=now - timedelta(days=2))
    progress = assess(CheckpointState(status=status, checkpoints=(), committed_count=0), now=now,
                      stall_timeout=timedelta(hours=1))
    assert (progress.kind, progress.skipped, progress.to_event()["skipped"]) == ("finished", True, True)
