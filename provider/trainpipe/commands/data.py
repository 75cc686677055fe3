"""``trainpipe demo-data`` and ``trainpipe datasets``: write the demo datasets, list a pipeline's dataset versions."""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from datetime import UTC, datetime
from pathlib import Path


def register(commands: argparse._SubParsersAction) -> None:
    demo = commands.add_parser("demo-data", help="write the deterministic demo datasets into storage")
    demo.add_argument("--out", help="folder (default: <storage root>/demo)")
    demo.add_argument("--end", help="last day of the data, YYYY-MM-DD (default: today, UTC)")
    demo.add_argument("--force", action="store_true", help="overwrite files that differ")
    demo.add_argument("--drift", metavar="FEATURE", help="make this transactions column drift (numeric: +1 standard "
                      "deviation; categorical: half the rows take its rarest category), to see validate stop a run")
    demo.set_defaults(func=_cmd_demo_data)

    datasets = commands.add_parser("datasets", help="list a pipeline's dataset versions (snapshots): digest, rows, "
                                   "size, schema hash, split, source, window, creating run, accepted or not")
    datasets.add_argument("pipeline")
    datasets.add_argument("--json", action="store_true", help="the full records as JSON")
    datasets.set_defaults(func=_cmd_datasets)


def _cmd_demo_data(args: argparse.Namespace) -> int:
    from trainpipe import storage
    from trainpipe.demo.synthetic import write_demo_data
    from trainpipe.errors import SpecError, StorageAccessError, StorageConflictError
    from trainpipe.settings import Settings

    settings = Settings.from_env()
    end = datetime.strptime(args.end, "%Y-%m-%d").replace(tzinfo=UTC) if args.end else \
        datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    try:
        with storage.storage_access(settings):
            # The same path code as the tasks: an s3:// root stays an object-store path, never a local folder.
            out = Path(args.out) if args.out and "://" not in args.out else \
                storage.resolve_uri(args.out or "demo", settings, settings.storage_conn_id)
            if not isinstance(out, Path) and out.protocol == "file":
                out = Path(out.path)  # local: written atomically (a rename), as before
            written = write_demo_data(out, end=end, force=args.force, drift=args.drift)
    except (SpecError, StorageConflictError, StorageAccessError) as err:
        print(f"trainpipe demo-data: {err}", file=sys.stderr)
        return 1
    for name, path in written.items():
        print(f"{name}: {path}")
    if args.drift:
        print(f"transactions: {args.drift} drifted (numeric: +1 standard deviation; categorical: half the rows "
              "moved to its rarest category)")
    return 0


def _cmd_datasets(args: argparse.Namespace) -> int:
    from trainpipe.errors import StorageAccessError
    from trainpipe.settings import Settings
    from trainpipe.state.datasets import baseline_version, list_versions
    from trainpipe.storage import shown_uri, storage_access, storage_root

    settings = Settings.from_env()
    try:
        with warnings.catch_warnings(), storage_access(settings):
            # Reading storage loads Airflow's providers; their deprecation notices would land in stdout (and --json).
            warnings.simplefilter("ignore")
            versions = list_versions(settings, args.pipeline)
            baseline = baseline_version(settings, args.pipeline) if versions else None
    except StorageAccessError as err:
        print(f"trainpipe datasets: {err}", file=sys.stderr)
        return 1
    if not versions:
        print(f"{args.pipeline}: no dataset versions stored yet in {shown_uri(storage_root(settings))} "
              "(the snapshot task writes them)")
        return 1
    baseline_digest = baseline["digest"] if baseline else None
    if args.json:
        print(json.dumps([{**info.to_dict(), "version": info.digest, "accepted": accepted,
                           "baseline": info.digest == baseline_digest} for info, accepted in versions],
                         indent=2, default=str))
        return 0
    for info, accepted in versions:
        marks = ["baseline" if info.digest == baseline_digest else "", "accepted" if accepted else "not accepted",
                 "backtest" if accepted and accepted.get("backtest") else ""]
        print(f"{info.name or args.pipeline} version {info.digest[:16]}  ({', '.join(m for m in marks if m)})")
        split = info.split or {}
        rows = [
            ("version", info.digest),
            ("storage", info.uri),
            *([("kind", "manifest: the source's files as listed in data_manifest.json, nothing copied")]
              if info.kind == "manifest" else []),
            ("rows", f"{info.rows} ({info.train_rows} train, {info.holdout_rows} holdout)"),
            ("size", f"{info.size_bytes} bytes" if info.size_bytes is not None else "-"),
            ("schema_hash", info.schema_hash or "-"),
            ("columns", ", ".join(f"{name}:{kind}" for name, kind in info.schema or []) or "-"),
            ("split", f"holdout {split['holdout_fraction']:g} by {split['method']}" if split else "-"),
            ("source", info.source_uri),
            ("window", f"{info.window_start} .. {info.window_end}" if info.window_end else "whole source"),
            ("created", f"{info.created_at or '-'} by {info.created_by_dag_id or '-'} run {info.created_by_run_id or '-'}"),
            ("accepted", f"{accepted['accepted_at']} by run {accepted['run_id']}" if accepted else "-"),
        ]
        for key, value in rows:
            print(f"  {key + ':':<13}{value}")
    return 0
