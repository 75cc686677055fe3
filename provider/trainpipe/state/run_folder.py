"""The run folder of a DAG run: ``runs/<pipeline>/<run key>`` under the storage root, the same for every try (a
retry finds the previous try's checkpoints there), laid out as the trainer contract says
(``trainpipe_trainer.run_layout``); and the result the trainer writes into it."""

from __future__ import annotations

from trainpipe import storage
from trainpipe.errors import TrainingFailedError
from trainpipe.plan.model import run_key
from trainpipe.settings import Settings
from trainpipe_trainer.outcomes import TrainingResult
from trainpipe_trainer.run_layout import OUTPUT_DIR, RESULT_FILE


def run_dir_for(pipeline_id: str, settings: Settings, airflow_run_id: str):
    """Per DAG run, identical for every try: retries find the previous try's checkpoints here."""
    return storage.storage_root(settings) / "runs" / pipeline_id / run_key(airflow_run_id)


def result_path_in(run_dir):
    """Where the trainer's rank 0 writes its ``TrainingResult``."""
    return run_dir / OUTPUT_DIR / RESULT_FILE


def read_training_result(run_dir) -> TrainingResult:
    result_path = result_path_in(run_dir)
    if not result_path.exists():
        raise TrainingFailedError(f"the trainer exited 0 but wrote no {result_path}; see the trainer output above")
    return TrainingResult.from_json(result_path.read_text())
