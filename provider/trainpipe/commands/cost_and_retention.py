"""``trainpipe cost`` and ``trainpipe gc``: what the trainings cost, and the storage they no longer need
(the work is in ``state.cost_report`` and ``state.retention``)."""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from datetime import UTC, datetime

from trainpipe.commands.options import configs_root


def register(commands: argparse._SubParsersAction) -> None:
    cost = commands.add_parser("cost", help="sum the GPU-hours, CPU-hours and cost of the trainings recorded in MLflow")
    cost.add_argument("--since", type=_duration, default=_duration("30d"),
                      help="runs started within this long (30d, 12h, 2w; default: 30d)")
    cost.add_argument("--by", choices=["pipeline", "team"], default="pipeline", help="group by (default: pipeline)")
    cost.add_argument("--json", action="store_true", help="the sums as JSON")
    cost.set_defaults(func=_cmd_cost)

    gc = commands.add_parser("gc", help="list (and with --apply delete) old checkpoints, unreferenced snapshots and "
                             "stale plan-cache entries, with their sizes")
    gc.add_argument("--older-than", type=_duration, default=_duration("30d"),
                    help="only what was last written longer ago than this (default: 30d)")
    gc.add_argument("--keep-runs", type=int, default=3, metavar="N",
                    help="keep the checkpoints of the last N finished runs of each pipeline (default: 3)")
    gc.add_argument("--apply", action="store_true", help="delete what is listed (without it nothing is deleted)")
    gc.add_argument("--configs", help="the specs whose pinned drift references are kept (default: "
                    "$TRAINPIPE_DAG_CONFIGS, else dag_configs/)")
    gc.set_defaults(func=_cmd_gc)


def _duration(text: str):
    from trainpipe.spec.types import parse_duration

    try:
        return parse_duration(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from err


def _cmd_cost(args: argparse.Namespace) -> int:
    from trainpipe.hooks.mlflow import MlflowHook
    from trainpipe.settings import Settings
    from trainpipe.state.cost_report import summarize_costs

    since = datetime.now(UTC) - args.since if args.since else None
    summary = summarize_costs(MlflowHook(Settings.from_env()).client, by=args.by, since=since)
    if args.json:
        print(json.dumps(summary.to_dict(), indent=2))
        return 0
    window = f"since {since:%Y-%m-%d %H:%M} UTC" if since else "all time"
    print(f"training usage by {args.by}, runs started {window} (trainings, trials and reproductions):")
    print(summary.as_text())
    return 0


def _cmd_gc(args: argparse.Namespace) -> int:
    from trainpipe.errors import TrainpipeError
    from trainpipe.settings import Settings
    from trainpipe.state.retention import collect, delete, drift_pins, format_plan

    settings = Settings.from_env()
    configs = configs_root(args, settings)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # provider deprecation notices from reading storage
            plan = collect(settings, older_than=args.older_than, keep_runs=args.keep_runs,
                           pins=drift_pins(configs, settings=settings))
            print(format_plan(plan, applying=args.apply))
            if args.apply and plan.items:
                deleted = delete(plan)
                print(f"deleted {len(deleted)} item(s), {sum(i.size_bytes for i in deleted)} bytes")
    except TrainpipeError as err:
        print(f"trainpipe gc: {err}", file=sys.stderr)
        return 1
    return 0
