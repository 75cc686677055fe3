"""``trainpipe validate`` and ``trainpipe render``: check specs, print one spec's compiled plan."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from trainpipe.commands.options import specs_folder

if TYPE_CHECKING:
    from trainpipe.plan.model import PipelinePlan
    from trainpipe.settings import Settings


def register(commands: argparse._SubParsersAction) -> None:
    validate = commands.add_parser("validate", help="check specs; exit 1 and print every problem if any")
    validate.add_argument("paths", nargs="*", help="spec files or folders (default: $TRAINPIPE_DAG_CONFIGS, else "
                          "dag_configs/)")
    validate.set_defaults(func=_cmd_validate)

    render = commands.add_parser("render", help="print the compiled plan of one spec")
    render.add_argument("file")
    render.add_argument("--k8s", action="store_true", help="print the Kubernetes manifests the train task would submit")
    render.set_defaults(func=_cmd_render)


def _cmd_validate(args: argparse.Namespace) -> int:
    from trainpipe.compile.compiler import compile_directory, compile_file
    from trainpipe.errors import SpecError
    from trainpipe.settings import POLICY_ENV, Settings

    settings = Settings.from_env()
    paths = [Path(p) for p in args.paths] or [specs_folder(None, option="a PATH argument", settings=settings)]
    errors = 0
    valid = 0
    if settings.policy_path is None:
        # On stderr: stdout stays one located problem per line, then the summary, for scripts.
        print(f"note: no platform policy in force ({POLICY_ENV} is unset): specs are checked without team rules",
              file=sys.stderr)
    for path in paths:
        if path.is_dir():
            result = compile_directory(path, relative_to=Path.cwd(), settings=settings)
            valid += len(result.plans)
            for err in result.errors.values():
                errors += len(err.problems)
                print(err)
            continue
        try:
            compile_file(path, settings=settings)
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
    from trainpipe.compile.compiler import compile_file
    from trainpipe.errors import SpecError
    from trainpipe.settings import Settings

    settings = Settings.from_env()
    try:
        plan = compile_file(Path(args.file), settings=settings)
    except SpecError as err:
        print(err)
        return 1
    if args.k8s:
        from trainpipe.errors import TrainpipeError

        try:
            print(render_manifests_yaml(plan, settings), end="")
        except TrainpipeError as err:
            print(err, file=sys.stderr)
            return 1
        return 0
    print(json.dumps(plan.to_dict(), indent=2, default=str))
    return 0


def render_manifests_yaml(plan: PipelinePlan, settings: Settings) -> str:
    """The train task's manifests (``operators.kubernetes_render``) as YAML that ``kubectl apply -f -``
    accepts, under a header naming the run they were rendered for."""
    import contextlib

    import yaml

    from trainpipe.operators.kubernetes_render import render_launch, render_manifests

    launch = render_launch(plan, settings=settings)
    # The operators log as they build ("Building pod ..."): diagnostics go to stderr, stdout stays YAML
    # that `kubectl apply -f -` accepts.
    with contextlib.redirect_stdout(sys.stderr):
        manifests = render_manifests(plan, settings=settings, launch=launch)
    header = (
        f"# Kubernetes manifests of the train task of {plan.dag_id} ({plan.spec_file}).\n"
        f"# Run-specific values (config URI, names) are those of run id {launch.airflow_run_id!r}, try "
        f"{launch.try_number};\n# a real run also labels the pods with its dag_id, run_id and try_number.\n"
    )
    return header + yaml.safe_dump_all(manifests, sort_keys=False, default_flow_style=False)
