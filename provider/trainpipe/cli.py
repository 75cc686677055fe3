"""The ``trainpipe`` command line."""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from datetime import datetime, timezone
from pathlib import Path



def _cmd_validate(args: argparse.Namespace) -> int:
    from trainpipe.errors import SpecError
    from trainpipe.factory import compile_directory, compile_file

    paths = [Path(p) for p in args.paths] or [_specs_folder(None, option="a PATH argument")]
    errors = 0
    valid = 0
    from trainpipe.policy import POLICY_ENV

    if not os.environ.get(POLICY_ENV):
        # On stderr: stdout stays one located problem per line, then the summary, for scripts.
        print(f"note: no platform policy in force ({POLICY_ENV} is unset): specs are checked without team rules",
              file=sys.stderr)
    for path in paths:
        if path.is_dir():
            result = compile_directory(path, relative_to=Path.cwd())
            valid += len(result.plans)
            for err in result.errors.values():
                errors += len(err.problems)
                print(err)
            continue
        try:
            compile_file(path)
            valid += 1
        except SpecError as err:
            errors += len(err.problems)
            print(err)
        except FileNotFoundError:
            errors += 1
            print(f"{path}: no such file or directory")
    print(f"{valid} valid spec(s), {errors} problem(s)")
    return 1 if errors else 0


def _cmd_render(args: argparse.Namespace) -> int:
    from trainpipe.errors import SpecError
    from trainpipe.factory import compile_file

    try:
        plan = compile_file(Path(args.file))
    except SpecError as err:
        print(err)
        return 1
    if args.k8s:
        from trainpipe.errors import TrainpipeError
        from trainpipe.operators.kubernetes_render import render_manifests_yaml

        try:
            print(render_manifests_yaml(plan), end="")
        except TrainpipeError as err:
            print(err, file=sys.stderr)
            return 1
        return 0
    print(json.dumps(plan.to_dict(), indent=2, default=str))
    return 0


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _cmd_train(args: argparse.Namespace) -> int:
    from trainpipe.errors import SpecError, TrainpipeError
    from trainpipe.factory import compile_file
    from trainpipe.runtime.train_cli import train_spec, with_nproc_per_node

    from trainpipe.settings import Settings
    from trainpipe.storage import storage_access

    try:
        plan = compile_file(Path(args.spec))
        if args.nproc_per_node is not None:
            plan = with_nproc_per_node(plan, args.nproc_per_node)
        with storage_access(Settings.from_env()):
            train_spec(plan, run_dir=args.run_dir, logical_date=args.logical_date)
    except (SpecError, TrainpipeError) as err:
        print(f"trainpipe train: {err}", file=sys.stderr)
        return 1
    return 0


def _specs_folder(given: str | None, *, option: str) -> Path:
    """The specs folder of every command that takes one optionally (``spec_files.resolve_specs_folder``:
    the argument, else ``TRAINPIPE_DAG_CONFIGS``, else ``dag_configs/``), said on stderr so stdout keeps
    each command's own format."""
    from trainpipe.spec_files import resolve_specs_folder, specs_folder_line

    folder, why = resolve_specs_folder(given, option=option)
    print(specs_folder_line(folder, why), file=sys.stderr)
    return folder


def _configs_root(args: argparse.Namespace) -> Path:
    """``--configs``, else ``$TRAINPIPE_DAG_CONFIGS``, else ``dag_configs/`` (reproduce and gc)."""
    return _specs_folder(args.configs, option="--configs")


def _cmd_reproduce(args: argparse.Namespace) -> int:
    from trainpipe.errors import TrainpipeError
    from trainpipe.runtime.reproduce import reproduce

    configs = _configs_root(args)
    from trainpipe.settings import Settings
    from trainpipe.storage import storage_access

    try:
        with storage_access(Settings.from_env()):
            outcome = reproduce(args.model, configs_root=configs.resolve(),
                                on_line=lambda line: print(line, flush=True))
    except TrainpipeError as err:
        print(f"trainpipe reproduce: {err}", file=sys.stderr)
        return 1
    lineage = outcome.lineage
    print(f"registered weights sha256: {lineage.weights_sha256}  ({lineage.model_name} version {lineage.version})")
    print(f"reproduced weights sha256: {outcome.weights_sha256}  (MLflow run {outcome.mlflow_run_id})")
    print(f"weights match: {'yes' if outcome.matches else 'NO'}")
    return 0 if outcome.matches else 1


def _cmd_demo_data(args: argparse.Namespace) -> int:
    from trainpipe import storage
    from trainpipe.demo.synthetic import write_demo_data
    from trainpipe.errors import SpecError, StorageAccessError, StorageConflictError
    from trainpipe.settings import Settings

    settings = Settings.from_env()
    end = datetime.strptime(args.end, "%Y-%m-%d").replace(tzinfo=timezone.utc) if args.end else \
        datetime.now(timezone.utc).replace(hour=0, minute=0, second=0, microsecond=0)
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
    from trainpipe.runtime.snapshot import baseline_version, list_versions
    from trainpipe.settings import Settings

    from trainpipe.errors import StorageAccessError
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


def _actor(args: argparse.Namespace) -> str:
    """Who runs a registry command: ``--actor``, else the OS user."""
    if args.actor:
        return args.actor
    import getpass

    try:
        return getpass.getuser()
    except (OSError, KeyError):  # no login name (a container with an unnamed uid)
        return f"uid {os.getuid()}"


def _print_promotion(promotion, *, verb: str) -> None:  # noqa: ANN001 - registry.Promotion
    replaced = f"version {promotion.replaced_version}" if promotion.replaced_version is not None else "none"
    if promotion.moved:
        print(f"{promotion.model_name} version {promotion.version} is now {promotion.alias} "
              f"({promotion.previous_alias}: {replaced})")
        print(f"  {verb} by {promotion.actor} at {promotion.at}: {promotion.reason}")
    else:
        print(f"{promotion.model_name} version {promotion.version} already is {promotion.alias}: nothing moved")
        if promotion.at:
            print(f"  promoted by {promotion.actor} at {promotion.at}: {promotion.reason}")


def _team(args: argparse.Namespace) -> str | None:
    """``--team``: required under a platform policy (and one of its teams), optional without one.
    ``SpecError`` (or ``PolicyError``) when it cannot be used."""
    from trainpipe.errors import SpecError
    from trainpipe.policy.model import policy_from_env

    policy = policy_from_env()
    if policy is None:
        return args.team
    if args.team is None:
        raise SpecError(f"a platform policy is in force: say which team acts with --team (one of "
                        f"{', '.join(sorted(policy.spec.teams))}); only the model's owner may move its aliases")
    if args.team not in policy.spec.teams:
        raise SpecError(f"--team {args.team!r} is not a team of the policy; teams: {', '.join(sorted(policy.spec.teams))}")
    return args.team


def _cmd_promote(args: argparse.Namespace) -> int:
    from trainpipe.errors import SpecError
    from trainpipe.hooks.mlflow import MlflowHook
    from trainpipe.registry import RegistryError, promote

    try:
        promotion = promote(MlflowHook().client, args.model, args.version, actor=_actor(args), reason=args.reason,
                            details={"command": "trainpipe promote"}, champion_alias=args.alias,
                            previous_alias=args.previous_alias, team=_team(args))
    except (RegistryError, SpecError) as err:
        print(f"trainpipe promote: {err}", file=sys.stderr)
        return 1
    _print_promotion(promotion, verb="promoted")
    return 0


def _cmd_rollback(args: argparse.Namespace) -> int:
    from trainpipe.errors import SpecError
    from trainpipe.hooks.mlflow import MlflowHook
    from trainpipe.registry import RegistryError, rollback

    try:
        promotion = rollback(MlflowHook().client, args.model, actor=_actor(args), reason=args.reason,
                             champion_alias=args.alias, previous_alias=args.previous_alias, team=_team(args))
    except (RegistryError, SpecError) as err:
        print(f"trainpipe rollback: {err}", file=sys.stderr)
        return 1
    _print_promotion(promotion, verb="rolled back")
    return 0


def _cmd_model(args: argparse.Namespace) -> int:
    if args.alias is None:
        return _model_summary(args)
    from trainpipe.hooks.mlflow import MlflowHook

    hook = MlflowHook()
    version = hook.version_by_alias(args.name, args.alias)
    if version is None:
        print(f"{args.name} has no version with alias {args.alias!r} in {hook.settings.mlflow_tracking_uri}")
        return 1
    print(f"registered model: {args.name}")
    print(f"version:          {version.version}")
    print(f"alias:            {args.alias}  (load with mlflow.pyfunc.load_model('models:/{args.name}@{args.alias}'))")
    print(f"source run:       {version.run_id}")
    for key in sorted(version.tags):
        label = "metric" if key.startswith("holdout_") else "tag"
        print(f"{label + ' ' + key + ':':<40}{version.tags[key]}")
    print(f"tracking store:   {hook.settings.mlflow_tracking_uri}")
    return 0


def _model_summary(args: argparse.Namespace) -> int:
    from trainpipe.hooks.mlflow import MlflowHook
    from trainpipe.registry import RegistryError, describe

    hook = MlflowHook()
    try:
        summary = describe(hook.client, args.name, last_promotions=args.last)
    except RegistryError as err:
        print(f"trainpipe model: {err}", file=sys.stderr)
        return 1
    print(f"registered model: {summary.name}  ({summary.version_count} version(s))")
    print("aliases:")
    if not summary.aliases:
        print("  none")
    width = max((len(alias) for alias in summary.aliases), default=0)
    details = {v.version: v for v in summary.aliased_versions}
    for alias, number in summary.aliases.items():
        version = details[number]
        metrics = ", ".join(f"{k.removeprefix('holdout_')}={val}" for k, val in version.metrics.items())
        rejected = "  REJECTED" if version.rejected else ""
        print(f"  {alias:<{width}}  version {number}  (run {version.airflow_run_id or version.run_id}, "
              f"created {version.created_at}{', ' + metrics if metrics else ''}){rejected}")
    print("last promotions (newest first):")
    if not summary.promotions:
        print("  none")
    for p in summary.promotions:
        replaced = f", replaced version {p.replaced_version}" if p.replaced_version is not None else ""
        print(f"  {p.at}  version {p.version}{replaced}  by {p.by}: {p.reason}")
    if summary.rejected_versions:
        print(f"rejected versions: {', '.join(map(str, summary.rejected_versions))}")
    print(f"details of one alias: trainpipe model {summary.name} --alias ALIAS")
    return 0


def _cmd_schema(args: argparse.Namespace) -> int:
    from trainpipe.spec.schema import spec_json_schema_text

    print(spec_json_schema_text(), end="")
    return 0


def _cmd_policy_check(args: argparse.Namespace) -> int:
    """Per spec: its team under the policy and every violation (any other problem of the spec too)."""
    from trainpipe.policy import POLICY_ENV

    previous = os.environ.get(POLICY_ENV)
    if args.policy:
        os.environ[POLICY_ENV] = args.policy  # what compiling reads; put back when done (main() may be called in-process)
    try:
        return _policy_check(args)
    finally:
        if previous is None:
            os.environ.pop(POLICY_ENV, None)
        else:
            os.environ[POLICY_ENV] = previous


def _policy_check(args: argparse.Namespace) -> int:
    from trainpipe.errors import SpecError
    from trainpipe.factory import compile_file, configs_root_for, spec_files
    from trainpipe.policy import POLICY_ENV
    from trainpipe.policy.model import PolicyError, policy_from_env, relative_spec_path

    try:
        policy = policy_from_env()
    except PolicyError as err:
        print(f"the policy is invalid; every spec is refused until it is fixed:\n{err}")
        return 1
    if policy is None:
        print(f"no platform policy in force: set {POLICY_ENV} or pass --policy FILE")
        return 2
    files: list[Path] = []
    for path in [Path(p) for p in args.paths] or [_specs_folder(None, option="a SPECS argument")]:
        files.extend(spec_files(path) if path.is_dir() else [path])
    failed = 0
    for path in files:
        name = str(path)
        team, why = policy.team_for(relative_spec_path(path.resolve(), configs_root_for(path)))
        print(f"{name}: team {team}" if team is not None else f"{name}: no team")
        try:
            compile_file(path, name)
        except SpecError as err:
            failed += 1
            for problem in err.problems:
                print(f"  {problem}")
        except OSError as err:
            failed += 1
            print(f"  cannot read the file: {err.strerror or type(err).__name__}")
        else:
            print("  allowed")
    print(f"{len(files) - failed} spec(s) allowed, {failed} refused (policy {policy.file})")
    return 1 if failed else 0


def _cmd_policy_schema(args: argparse.Namespace) -> int:
    from trainpipe.policy.model import policy_json_schema_text

    print(policy_json_schema_text(), end="")
    return 0


def _starter_table(uri: str):  # noqa: ANN202 - pandas.DataFrame
    """The table ``init --data`` fits a starter to (parquet, or CSV by its suffix), by spec URI."""
    from trainpipe import storage
    from trainpipe.errors import SpecError
    from trainpipe.settings import Settings

    path = storage.resolve_uri(uri, Settings.from_env())
    if not path.exists():
        raise SpecError(f"--data: {uri} does not exist (read as {path}); give a parquet file's path relative to "
                        "the storage root, or a file:// or s3:// URI")
    import pandas as pd

    with path.open("rb") as handle:
        return pd.read_csv(handle) if uri.endswith(".csv") else storage.parquet_from_bytes(handle.read())


def _cmd_init(args: argparse.Namespace) -> int:
    from trainpipe.errors import SpecError
    from trainpipe.spec.starter import write_starter_spec

    try:
        table = _starter_table(args.data) if args.data else None
        path = write_starter_spec(args.name, task=args.task, directory=_specs_folder(args.dir, option="--dir"),
                                  data=args.data, label=args.label, table=table)
    except (SpecError, FileExistsError) as err:
        print(f"trainpipe init: {err}", file=sys.stderr)
        return 1
    print(f"wrote {path}; edit it, then run: trainpipe validate {path}")
    return 0


def _duration(text: str):  # noqa: ANN202 - timedelta
    from trainpipe.spec.types import parse_duration

    try:
        return parse_duration(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from err


def _cmd_cost(args: argparse.Namespace) -> int:
    from trainpipe.hooks.mlflow import MlflowHook
    from trainpipe.runtime.cost_report import summarize_costs

    since = datetime.now(timezone.utc) - args.since if args.since else None
    summary = summarize_costs(MlflowHook().client, by=args.by, since=since)
    if args.json:
        print(json.dumps(summary.to_dict(), indent=2))
        return 0
    window = f"since {since:%Y-%m-%d %H:%M} UTC" if since else "all time"
    print(f"training usage by {args.by}, runs started {window} (trainings, trials and reproductions):")
    print(summary.as_text())
    return 0


def _drift_pins(configs: Path):  # noqa: ANN202 - retention.DriftPins, imported lazily
    """The drift references the specs under ``configs`` pin, for ``gc`` to keep."""
    from trainpipe.factory import compile_directory
    from trainpipe.runtime.retention import DriftPins

    if not configs.is_dir():
        return DriftPins(by_pipeline={}, unknown_because=f"there is no spec folder {configs} (pass --configs)")
    result = compile_directory(configs, relative_to=configs.resolve().parent)
    pins: dict[str, dict[str, str]] = {}
    for plan in result.plans.values():
        drift = plan.validation.drift
        if drift is not None and drift.reference != "baseline":
            pins.setdefault(plan.dag_id, {})[drift.reference] = plan.spec_relative_path
    unknown = ""
    if result.errors:
        unknown = (f"{len(result.errors)} spec(s) do not compile ({', '.join(sorted(result.errors))}; "
                   "`trainpipe validate` says why)")
    return DriftPins(by_pipeline=pins, unknown_because=unknown)


def _cmd_gc(args: argparse.Namespace) -> int:
    from trainpipe.errors import TrainpipeError
    from trainpipe.runtime.retention import collect, delete, format_plan
    from trainpipe.settings import Settings

    settings = Settings.from_env()
    configs = _configs_root(args)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # provider deprecation notices from reading storage
            plan = collect(settings, older_than=args.older_than, keep_runs=args.keep_runs, pins=_drift_pins(configs))
            print(format_plan(plan, applying=args.apply))
            if args.apply and plan.items:
                deleted = delete(plan)
                print(f"deleted {len(deleted)} item(s), {sum(i.size_bytes for i in deleted)} bytes")
    except TrainpipeError as err:
        print(f"trainpipe gc: {err}", file=sys.stderr)
        return 1
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="trainpipe", description="YAML specs -> Airflow ML training pipelines")
    commands = parser.add_subparsers(dest="command", required=True)

    validate = commands.add_parser("validate", help="check specs; exit 1 and print every problem if any")
    validate.add_argument("paths", nargs="*", help="spec files or folders (default: $TRAINPIPE_DAG_CONFIGS, else "
                          "dag_configs/)")
    validate.set_defaults(func=_cmd_validate)

    render = commands.add_parser("render", help="print the compiled plan of one spec")
    render.add_argument("file")
    render.add_argument("--k8s", action="store_true", help="print the Kubernetes manifests the train task would submit")
    render.set_defaults(func=_cmd_render)

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

    schema = commands.add_parser("schema", help="print the JSON Schema (draft 2020-12) of a spec")
    schema.set_defaults(func=_cmd_schema)

    policy = commands.add_parser("policy", help="the platform policy (TRAINPIPE_POLICY): check specs against it, "
                                 "print its JSON Schema")
    policy_commands = policy.add_subparsers(dest="policy_command", required=True)
    check = policy_commands.add_parser("check", help="print each spec's team and every violation; exit 1 if any")
    check.add_argument("paths", nargs="*", help="spec files or folders (default: $TRAINPIPE_DAG_CONFIGS, else "
                       "dag_configs/)")
    check.add_argument("--policy", help="the policy file to check against (default: $TRAINPIPE_POLICY)")
    check.set_defaults(func=_cmd_policy_check)
    policy_schema = policy_commands.add_parser("schema", help="print the JSON Schema (draft 2020-12) of a policy")
    policy_schema.set_defaults(func=_cmd_policy_schema)

    init = commands.add_parser("init", help="write a valid, commented starter spec")
    init.add_argument("name", help="pipeline id, also the file name")
    init.add_argument("--task", required=True, choices=["binary_classification", "regression", "ranking"])
    init.add_argument("--dir", help="folder (default: $TRAINPIPE_DAG_CONFIGS, else dag_configs/)")
    init.add_argument("--data", help="a table (parquet, or .csv) to fit the starter to: its columns become the "
                      "features, its rows size batch, learning rate and epochs (relative to the storage root, or a URI)")
    init.add_argument("--label", help="with --data: the column the model predicts")
    init.set_defaults(func=_cmd_init)

    model = commands.add_parser("model", help="show a registered model's aliases and last promotions, or with "
                                "--alias the version holding that alias")
    model.add_argument("name")
    model.add_argument("--alias", help="show this alias's version in full (tags, metrics, source run)")
    model.add_argument("--last", type=int, default=5, help="how many promotions to list (default: 5)")
    model.set_defaults(func=_cmd_model)

    promote = commands.add_parser("promote", help="make VERSION the champion; the replaced champion becomes "
                                  "previous_champion (tags who, when, why)")
    promote.add_argument("model")
    promote.add_argument("version", type=int)
    promote.set_defaults(func=_cmd_promote, reason="manual promotion with `trainpipe promote`")
    rollback = commands.add_parser("rollback", help="champion back to previous_champion, in one step (the "
                                   "replaced version becomes previous_champion)")
    rollback.add_argument("model")
    rollback.set_defaults(func=_cmd_rollback, reason="manual rollback with `trainpipe rollback`")
    for command in (promote, rollback):
        command.add_argument("--reason", help="why, recorded on the version (default: says it was done by hand)")
        command.add_argument("--actor", help="who, recorded on the version (default: the OS user)")
        command.add_argument("--alias", default="champion", help="the production alias (default: champion)")
        command.add_argument("--previous-alias", default="previous_champion",
                             help="the alias the replaced version takes (default: previous_champion)")
        command.add_argument("--team", help="the team acting (required under a platform policy): refused unless "
                             "it owns the model (its trainpipe.owner tag)")
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
