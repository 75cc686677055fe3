"""``trainpipe train`` and ``trainpipe reproduce``: training outside Airflow (the work is in
``steps.train.standalone`` and ``steps.train.reproduce``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from trainpipe.commands.options import configs_root


def register(commands: argparse._SubParsersAction) -> None:
    train = commands.add_parser("train", help="run only the training step of a spec locally (same launcher as the DAG)")
    train.add_argument("spec")
    train.add_argument("--run-dir", help="run folder (path or URI); resumes from its committed checkpoints if they "
                       "were written with the same snapshot and settings, else stops and says what differs")
    train.add_argument("--logical-date", help="end of the data window, ISO date or datetime (default: the start of "
                       "the current UTC day, as today's @daily run; so runs on one day train on the same data)")
    train.add_argument("--nproc-per-node", type=_positive_int, metavar="N",
                       help="processes per node for this run instead of training.distributed.nproc_per_node; a run "
                       "dir written with another number is resumed by resharding its checkpoint (ddp only)")
    train.set_defaults(func=_cmd_train)

    reproduce = commands.add_parser(
        "reproduce", help="train a registered model version again from its lineage; compare the weights' sha256")
    reproduce.add_argument("model", help="MODEL@ALIAS (fraud_detector@champion) or MODEL/VERSION (fraud_detector/3)")
    reproduce.add_argument("--configs", help="configs root whose _defaults.yaml apply to the logged spec "
                           "(default: $TRAINPIPE_DAG_CONFIGS, else dag_configs/)")
    reproduce.set_defaults(func=_cmd_reproduce)


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _cmd_train(args: argparse.Namespace) -> int:
    from trainpipe.compile.compiler import compile_file
    from trainpipe.errors import SpecError, TrainpipeError
    from trainpipe.settings import Settings
    from trainpipe.steps.train.standalone import train_spec, with_nproc_per_node
    from trainpipe.storage import storage_access

    settings = Settings.from_env()
    try:
        plan = compile_file(Path(args.spec), settings=settings)
        if args.nproc_per_node is not None:
            plan = with_nproc_per_node(plan, args.nproc_per_node)
        with storage_access(settings):
            relay = _Relay()
            result = train_spec(plan, settings=settings, run_dir=args.run_dir, logical_date=args.logical_date,
                                on_line=relay)
            if result is not None and relay.last != f"{WEIGHTS_LINE}{result.weights_sha256}":
                # Something came after the trainer's hash line (or it never came): the hash is the last line anyway.
                print(f"{WEIGHTS_LINE}{result.weights_sha256}", flush=True)
    except (SpecError, TrainpipeError) as err:
        print(f"trainpipe train: {err}", file=sys.stderr)
        return 1
    return 0


# The trainer's last line and the command's: "weights sha256: <hex>".
WEIGHTS_LINE = "weights sha256: "


class _Relay:
    """Prints the launch's lines as they come, and remembers the last one."""

    last: str | None = None

    def __call__(self, line: str) -> None:
        self.last = line
        print(line, flush=True, file=sys.stdout)


def _cmd_reproduce(args: argparse.Namespace) -> int:
    from trainpipe.errors import TrainpipeError
    from trainpipe.settings import Settings
    from trainpipe.steps.train.reproduce import reproduce
    from trainpipe.storage import storage_access

    settings = Settings.from_env()
    configs = configs_root(args, settings)
    try:
        with storage_access(settings):
            outcome = reproduce(args.model, configs_root=configs.resolve(), settings=settings,
                                on_line=lambda line: print(line, flush=True))
    except TrainpipeError as err:
        print(f"trainpipe reproduce: {err}", file=sys.stderr)
        return 1
    lineage = outcome.lineage
    print(f"registered weights sha256: {lineage.weights_sha256}  ({lineage.model_name} version {lineage.version})")
    print(f"reproduced weights sha256: {outcome.weights_sha256}  (MLflow run {outcome.mlflow_run_id})")
    print(f"weights match: {'yes' if outcome.matches else 'NO'}")
    return 0 if outcome.matches else 1
