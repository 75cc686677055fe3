"""``trainpipe schema``, ``trainpipe policy`` and ``trainpipe init``: what spec and policy authors write against
(the JSON Schemas, the policy check) and start from (a starter spec)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from trainpipe.commands.options import specs_folder
from trainpipe_trainer.config import TASK_TYPES

if TYPE_CHECKING:
    from trainpipe.settings import Settings


def register(commands: argparse._SubParsersAction) -> None:
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
    init.add_argument("--task", required=True, choices=TASK_TYPES)
    init.add_argument("--dir", help="folder (default: $TRAINPIPE_DAG_CONFIGS, else dag_configs/)")
    init.add_argument("--data", help="a table (parquet, or .csv) to fit the starter to: its columns become the "
                      "features, its rows size batch, learning rate and epochs (relative to the storage root, or a URI)")
    init.add_argument("--label", help="with --data: the column the model predicts")
    init.set_defaults(func=_cmd_init)


def _cmd_schema(args: argparse.Namespace) -> int:
    from trainpipe.spec.schema import spec_json_schema_text

    print(spec_json_schema_text(), end="")
    return 0


def _cmd_policy_check(args: argparse.Namespace) -> int:
    """Per spec: its team under the policy and every violation (any other problem of the spec too)."""
    from trainpipe.settings import Settings

    return _policy_check(args, Settings.from_env().with_policy(args.policy))


def _policy_check(args: argparse.Namespace, settings: Settings) -> int:
    from trainpipe.compile.compiler import compile_file, configs_root_for, spec_files
    from trainpipe.errors import SpecError
    from trainpipe.policy.model import PolicyError, policy_in_force, relative_spec_path
    from trainpipe.settings import POLICY_ENV

    try:
        policy = policy_in_force(settings)
    except PolicyError as err:
        print(f"the policy is invalid; every spec is refused until it is fixed:\n{err}")
        return 1
    if policy is None:
        print(f"no platform policy in force: set {POLICY_ENV} or pass --policy FILE")
        return 2
    files: list[Path] = []
    for path in [Path(p) for p in args.paths] or [specs_folder(None, option="a SPECS argument", settings=settings)]:
        files.extend(spec_files(path) if path.is_dir() else [path])
    failed = 0
    for path in files:
        name = str(path)
        team, why = policy.team_for(relative_spec_path(path.resolve(), configs_root_for(path, settings)))
        print(f"{name}: team {team}" if team is not None else f"{name}: no team")
        try:
            compile_file(path, name, settings=settings)
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


def _starter_table(uri: str, settings: Settings):
    """The table ``init --data`` fits a starter to (parquet, or CSV by its suffix), by spec URI."""
    from trainpipe import storage
    from trainpipe.errors import SpecError

    path = storage.resolve_uri(uri, settings)
    if not path.exists():
        raise SpecError(f"--data: {uri} does not exist (read as {path}); give a parquet file's path relative to "
                        "the storage root, or a file:// or s3:// URI")
    import pandas as pd

    with path.open("rb") as handle:
        return pd.read_csv(handle) if uri.endswith(".csv") else storage.parquet_from_bytes(handle.read())


def _cmd_init(args: argparse.Namespace) -> int:
    from trainpipe.errors import SpecError
    from trainpipe.settings import Settings
    from trainpipe.spec.starter import write_starter_spec

    settings = Settings.from_env()
    try:
        table = _starter_table(args.data, settings) if args.data else None
        path = write_starter_spec(args.name, task=args.task,
                                  directory=specs_folder(args.dir, option="--dir", settings=settings),
                                  data=args.data, label=args.label, table=table)
    except (SpecError, FileExistsError) as err:
        print(f"trainpipe init: {err}", file=sys.stderr)
        return 1
    print(f"wrote {path}; edit it, then run: trainpipe validate {path}")
    return 0
