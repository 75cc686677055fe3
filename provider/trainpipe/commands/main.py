"""The ``trainpipe`` command line: the top-level parser; each subject module registers its own subcommands."""

from __future__ import annotations

import argparse
import os

from trainpipe.commands import authoring, cost_and_retention, data, models, specs, training

# In this order `trainpipe --help` lists the subcommands: validate, render, train, reproduce, demo-data,
# datasets, cost, gc, schema, policy, init, model, promote, rollback.
SUBJECTS = (specs, training, data, cost_and_retention, authoring, models)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="trainpipe", description="YAML specs -> Airflow ML training pipelines")
    commands = parser.add_subparsers(dest="command", required=True)
    for subject in SUBJECTS:
        subject.register(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # Airflow's libraries (the S3 connection, the providers) log at INFO to stdout when a command reaches storage;
    # a command's output is what it prints. Set before Airflow is imported (it reads its configuration then),
    # and only while the command runs (main() may be called inside a longer-lived process).
    level = "AIRFLOW__LOGGING__LOGGING_LEVEL"
    if level in os.environ:
        return args.func(args)
    os.environ[level] = "WARNING"
    try:
        return args.func(args)
    finally:
        os.environ.pop(level, None)


if __name__ == "__main__":
    raise SystemExit(main())
