"""``trainpipe model``, ``trainpipe promote`` and ``trainpipe rollback``: read and move a registered model's aliases."""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainpipe.settings import Settings


def register(commands: argparse._SubParsersAction) -> None:
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


def _actor(args: argparse.Namespace) -> str:
    """Who runs a registry command: ``--actor``, else the OS user."""
    if args.actor:
        return args.actor
    import getpass

    try:
        return getpass.getuser()
    except (OSError, KeyError):  # no login name (a container with an unnamed uid)
        return f"uid {os.getuid()}"


def _print_promotion(promotion, *, verb: str) -> None:
    replaced = f"version {promotion.replaced_version}" if promotion.replaced_version is not None else "none"
    if promotion.moved:
        print(f"{promotion.model_name} version {promotion.version} is now {promotion.alias} "
              f"({promotion.previous_alias}: {replaced})")
        print(f"  {verb} by {promotion.actor} at {promotion.at}: {promotion.reason}")
    else:
        print(f"{promotion.model_name} version {promotion.version} already is {promotion.alias}: nothing moved")
        if promotion.at:
            print(f"  promoted by {promotion.actor} at {promotion.at}: {promotion.reason}")


def _team(args: argparse.Namespace, settings: Settings) -> str | None:
    """``--team``: required under a platform policy (and one of its teams), optional without one.
    ``SpecError`` (or ``PolicyError``) when it cannot be used."""
    from trainpipe.errors import SpecError
    from trainpipe.policy.model import policy_in_force

    policy = policy_in_force(settings)
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
    from trainpipe.settings import Settings
    from trainpipe.steps.register.model_registry import RegistryError, promote

    settings = Settings.from_env()
    try:
        promotion = promote(MlflowHook(settings).client, args.model, args.version, actor=_actor(args),
                            reason=args.reason, details={"command": "trainpipe promote"}, champion_alias=args.alias,
                            previous_alias=args.previous_alias, team=_team(args, settings))
    except (RegistryError, SpecError) as err:
        print(f"trainpipe promote: {err}", file=sys.stderr)
        return 1
    _print_promotion(promotion, verb="promoted")
    return 0


def _cmd_rollback(args: argparse.Namespace) -> int:
    from trainpipe.errors import SpecError
    from trainpipe.hooks.mlflow import MlflowHook
    from trainpipe.settings import Settings
    from trainpipe.steps.register.model_registry import RegistryError, rollback

    settings = Settings.from_env()
    try:
        promotion = rollback(MlflowHook(settings).client, args.model, actor=_actor(args), reason=args.reason,
                             champion_alias=args.alias, previous_alias=args.previous_alias,
                             team=_team(args, settings))
    except (RegistryError, SpecError) as err:
        print(f"trainpipe rollback: {err}", file=sys.stderr)
        return 1
    _print_promotion(promotion, verb="rolled back")
    return 0


def _cmd_model(args: argparse.Namespace) -> int:
    if args.alias is None:
        return _model_summary(args)
    from trainpipe.hooks.mlflow import MlflowHook
    from trainpipe.settings import Settings

    hook = MlflowHook(Settings.from_env())
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
    from trainpipe.settings import Settings
    from trainpipe.steps.register.model_registry import RegistryError, describe

    hook = MlflowHook(Settings.from_env())
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
