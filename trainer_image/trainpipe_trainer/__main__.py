"""``torchrun [--standalone] --nproc_per_node=N -m trainpipe_trainer --config URI`` (or plain ``python -m``)."""

from __future__ import annotations

import argparse
import atexit
import json
import os
import sys
import threading
from typing import NoReturn

from trainpipe_trainer import storage
from trainpipe_trainer.config import TrainerConfigError, TrainingConfig
from trainpipe_trainer.console import write_whole_lines
from trainpipe_trainer.errors import (
    EXIT_BAD_INPUT,
    USER_ERRORS,
    PreemptedError,
    StoppedAtStepError,
    TrainerInputError,
    TrainingStopped,
    TrialPrunedError,
)
from trainpipe_trainer.preemption import PreemptionWatcher
from trainpipe_trainer.tracking.launch_timing import LaunchPhases


def load_config(uri: str) -> TrainingConfig:
    # No storage options yet (they live inside the config): fsspec's env-driven defaults apply.
    try:
        text = storage.read_text(uri)
    except FileNotFoundError as err:
        raise TrainerInputError(f"--config {uri}: no such file") from err
    try:
        return TrainingConfig.from_json(text)
    except json.JSONDecodeError as err:
        raise TrainerConfigError(f"--config {uri}: not valid JSON: {err}") from err


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainpipe_trainer", description=__doc__)
    parser.add_argument("--config", required=True, help="training config JSON: local path or fsspec URI")
    args = parser.parse_args(argv)
    phases = LaunchPhases.since_process_start()
    phases.mark("interpreter start")
    # First: a SIGTERM while torch loads or ranks meet must still end in a checkpoint, not a kill.
    with PreemptionWatcher() as watcher:
        return _run(args.config, watcher, phases)


def _run(config_uri: str, watcher: PreemptionWatcher, phases: LaunchPhases) -> int:
    try:
        config = load_config(config_uri)
        from trainpipe_trainer.data.splits import read_in_background
        from trainpipe_trainer.models import text_tokenizer_of

        # Read while torch imports: the parquet decode and array work release the GIL (about 1 s of
        # a 2-core launch). Torch is imported only now: a bad config fails fast, before it loads.
        splits = read_in_background(config, text_tokenizer_of)
        if os.environ.get("RANK", "0") == "0":
            # Rank 0 tracks: MLflow starts in its own process now, on another core while torch imports.
            from trainpipe_trainer.tracking.mlflow_process import MlflowStore

            MlflowStore.open(config.tracking.tracking_uri)
        if config.tuning is not None and config.tuning.worker is not None:
            # A trial worker: the study's trials back to back in this one launch.
            from trainpipe_trainer.trial_worker import run_worker as run_training
        else:
            from trainpipe_trainer.trainer import run_training

        phases.mark("imports")
        run_training(config, watcher, phases, splits=splits)
    except USER_ERRORS as err:
        _report(err)
        return EXIT_BAD_INPUT
    except TrainingStopped as err:
        # Diverged (4), pruned (5) or preempted (config.PREEMPTED_EXIT_CODE): expected outcomes, one line, no traceback.
        _report(err, label="stopped" if isinstance(err, PreemptedError | TrialPrunedError | StoppedAtStepError)
                else "error")
        return err.exit_code
    return 0


def _report(err: BaseException, *, label: str = "error") -> None:
    rank = f"[rank {os.environ['RANK']}] " if int(os.environ.get("WORLD_SIZE", "1")) > 1 else ""
    print(f"trainpipe_trainer: {rank}{label}: {err}", file=sys.stderr, flush=True)


def exit_without_teardown(code: int) -> NoReturn:
    """End the process without the interpreter's teardown of every module and object: with torch loaded
    that alone took 1.7 s of each launch on 2 cores, after the work was done. What must happen at exit
    still does, in the interpreter's own order: other threads are joined, the atexit handlers run
    (MLflow's, logging's), the streams are flushed. Before torch loaded (a bad config) there is nothing
    slow to skip: the usual exit."""
    if "torch" not in sys.modules:
        sys.exit(code)
    threading._shutdown()  # what the interpreter itself calls first at exit (joins non-daemon threads)
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    write_whole_lines()
    # An unexpected exception still ends the usual way (its traceback, then the interpreter's exit).
    exit_without_teardown(main())
