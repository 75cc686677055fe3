"""The model registry's lifecycle: stages as MLflow aliases, moved by ``register``, ``promote``,
``trainpipe promote`` and ``trainpipe rollback``.

- ``register`` creates one version per DAG run (a retry finds the one it made) and gives it the
  challenger alias.
- ``promote`` moves the production alias (champion) to it and the replaced version to the previous
  alias; the promoted version's tags record who, when and why.
- ``rollback`` moves the production alias back to the previous version, in one command.

Nothing is deleted: versions stay, aliases only move, and each move is recorded in version tags.
Airflow-free (the CLI calls the same functions as the DAG's tasks); MLflow client only.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from trainpipe.errors import TrainpipeError, markdown_text
from trainpipe.hooks.mlflow import MlflowHook, mlflow_metric_key
from trainpipe.plan.tracking import (
    BACKTEST_TAG,
    EVALUATION_REPORT_TAG,
    OWNER_TAG,
    PROMOTED_AT_TAG,
    PROMOTED_BY_TAG,
    PROMOTION_DETAILS_TAG,
    PROMOTION_HISTORY_TAG,
    PROMOTION_LOG_TAG,
    PROMOTION_REASON_TAG,
    REJECTED_AT_TAG,
    REJECTED_BY_TAG,
    REJECTED_TAG,
    REJECTION_REASON_TAG,
    REPLACED_VERSION_TAG,
    ROLLBACK_REASON_TAG,
    ROLLED_BACK_AT_TAG,
    ROLLED_BACK_BY_TAG,
    STAGED_AT_TAG,
    VERSION_DAG_ID_TAG,
    VERSION_RUN_ID_TAG,
    WEIGHTS_SHA256_TAG,
)

if TYPE_CHECKING:
    from mlflow import MlflowClient
    from mlflow.entities.model_registry import ModelVersion

    from trainpipe.plan.model import RegistrationPlan

log = logging.getLogger(__name__)

# The promotion history on the registered model (PROMOTION_HISTORY_TAG): its last entries, reasons cut.
PROMOTION_HISTORY_LENGTH = 20
PROMOTION_HISTORY_REASON_CHARS = 120

DEFAULT_CHAMPION_ALIAS = "champion"
DEFAULT_PREVIOUS_ALIAS = "previous_champion"


class RegistryError(TrainpipeError):
    """A registry command cannot do what was asked (unknown model or version, nothing to roll back to)."""


class OwnershipError(RegistryError):
    """The registered model belongs to another team (its ``trainpipe.owner`` tag): nothing is changed."""


def check_owner(model: Any, team: str | None, *, action: str) -> None:
    """Refuse ``action`` on ``model`` (a RegisteredModel) unless ``team`` owns it; without a team (no
    policy) anything goes, as before. A model with no owner tag is nobody's yet: only ``register``
    claims it (``claim_if_unowned``), a promotion of it is refused."""
    if team is None:
        return
    owner = (model.tags or {}).get(OWNER_TAG)
    if owner == team:
        return
    if owner is None:
        raise OwnershipError(
            f"{action} refused: registered model {model.name!r} has no {OWNER_TAG} tag, so no team owns it; "
            f"a run of team {team} claims it when it registers a version, or the platform tags it "
            f"({OWNER_TAG}={team})")
    raise OwnershipError(f"{action} refused: registered model {model.name!r} belongs to team {owner} "
                         f"({OWNER_TAG}), not to team {team}; register under your team's own model name")


@dataclass(frozen=True, slots=True, kw_only=True)
class Promotion:
    """One move of the production alias, or the finding that it was already done (``moved`` False)."""

    model_name: str
    version: int
    alias: str
    previous_alias: str
    # The version that held the alias before (it now holds previous_alias); None for the first champion.
    replaced_version: int | None
    moved: bool
    actor: str
    at: str
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True, kw_only=True)
class PromotionRecord:
    """One entry of the model's promotion log (a rollback is one too, its reason says so)."""

    version: int
    at: str
    by: str
    reason: str
    replaced_version: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class VersionSummary:
    version: int
    aliases: tuple[str, ...]
    run_id: str | None
    created_at: str
    dag_id: str | None
    airflow_run_id: str | None
    metrics: dict[str, str]
    rejected: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSummary:
    """What ``trainpipe model NAME`` shows: every alias and the last promotions."""

    name: str
    version_count: int
    # Alias -> version, sorted by alias.
    aliases: dict[str, int]
    # The versions holding an alias, newest first.
    aliased_versions: tuple[VersionSummary, ...]
    # Newest first.
    promotions: tuple[PromotionRecord, ...]
    rejected_versions: tuple[int, ...] = ()


def now_utc() -> str:
    """UTC ISO time with milliseconds: sorts as text, and two moves in one second keep their order."""
    return datetime.now(UTC).isoformat(timespec="milliseconds")


# ---------------------------------------------------------------------------------------------
# register


def _logged_model_id(model_uri: str) -> str | None:
    """``m-...`` of a logged model's ``models:/<model_id>`` URI. A tracking server refuses such a source
    unless the version names the model it comes from (a local store does not check)."""
    reference = model_uri.removeprefix("models:/")
    if reference == model_uri or "/" in reference or "@" in reference:
        return None
    return reference


def _quoted(value: str) -> str:
    """A filter-string literal; MLflow's filter parser takes either quote."""
    return f'"{value}"' if "'" in value else f"'{value}'"


def version_of_run(client: MlflowClient, model_name: str, *, mlflow_run_id: str, dag_id: str,
                   airflow_run_id: str) -> ModelVersion | None:
    """The version an earlier try of this DAG run registered, if any (the idempotency key is
    (dag_id, airflow_run_id), the lineage tags every version carries)."""
    found = client.search_model_versions(f"run_id = {_quoted(mlflow_run_id)}")
    mine = [v for v in found if v.name == model_name and v.tags.get(VERSION_DAG_ID_TAG) == dag_id
            and v.tags.get(VERSION_RUN_ID_TAG) == airflow_run_id]
    return min(mine, key=lambda v: int(v.version)) if mine else None


def report_uri(evaluation: dict[str, Any]) -> str | None:
    """The evaluation report of the run, when evaluate wrote one: ``runs:/<run>/<path>`` (the same on
    every machine), else the artifact URI it gave."""
    report = evaluation.get("report") or {}
    if report.get("run_id") and report.get("artifact_path"):
        return f"runs:/{report['run_id']}/{report['artifact_path']}"
    return report.get("artifact_uri")


def _version_description(tags: dict[str, str], evaluation: dict[str, Any], report: str | None) -> str:
    gates = evaluation.get("gates") or []
    lines = [f"Trained by DAG {tags.get(VERSION_DAG_ID_TAG, '?')}, run {tags.get(VERSION_RUN_ID_TAG, '?')}.",
             gate_summary(gates) if gates else "No gates."]
    if report:
        lines.append(f"Evaluation report: {report}")
    return "\n".join(lines)


def register_candidate(registration: RegistrationPlan, *, model_uri: str, mlflow_run_id: str,
                       tags: dict[str, str], evaluation: dict[str, Any], hook: MlflowHook,
                       backtest: bool = False) -> dict[str, Any]:
    """The DAG run's model version with its lineage tags and the challenger alias; a retry or a re-run
    of the task finds the version it made before and moves no alias again. A ``backtest``'s version is
    tagged ``BACKTEST_TAG`` and takes ``registration.backtest.alias`` (if any), never the challenger alias."""
    client = hook.client
    if backtest:
        tags = {**tags, BACKTEST_TAG: "true"}
    alias = registration.backtest.alias if backtest else registration.challenger_alias
    name = registration.model_name
    team = registration.owner_team
    from mlflow.exceptions import MlflowException

    try:
        model = client.get_registered_model(name)
    except MlflowException:
        # The owner tag is written with the model (one call): a model trainpipe creates is never unowned.
        # MLflow's UI renders the description as Markdown: the spec's words are shown as written.
        client.create_registered_model(name, description=markdown_text(registration.description) or None,
                                       tags={OWNER_TAG: team} if team is not None else None)
    else:
        if team is not None and OWNER_TAG not in (model.tags or {}):
            # Made before the policy (or outside trainpipe): the spec stage proved the name is the team's.
            client.set_registered_model_tag(name, OWNER_TAG, team)
            log.warning("registered model %s had no owner: team %s claims it (%s)", name, team, OWNER_TAG)
            model = client.get_registered_model(name)
        check_owner(model, team, action="register")
    report = report_uri(evaluation)
    existing = version_of_run(client, name, mlflow_run_id=mlflow_run_id, dag_id=tags[VERSION_DAG_ID_TAG],
                              airflow_run_id=tags[VERSION_RUN_ID_TAG])
    if existing is None:
        # The lineage tags are written with the version (one call): a version never lacks its key.
        version = client.create_model_version(name, model_uri, run_id=mlflow_run_id, tags=tags,
                                              model_id=_logged_model_id(model_uri),
                                              description=_version_description(tags, evaluation, report))
    else:
        version = existing
        log.info("%s version %s was registered for this DAG run already: reused, no new version", name, version.version)
    extra = {f"holdout_{mlflow_metric_key(key)}": f"{value:.6f}" for key, value in evaluation["candidate"].items()}
    if report:
        extra[EVALUATION_REPORT_TAG] = report
    for key, value in extra.items():
        if version.tags.get(key) != value:
            client.set_model_version_tag(name, version.version, key, value)
    if alias is not None and STAGED_AT_TAG not in version.tags:
        # Once per version: a re-run after a newer version became challenger must not take it back.
        client.set_registered_model_alias(name, alias, version.version)
        client.set_model_version_tag(name, version.version, STAGED_AT_TAG, now_utc())
        log.info("registered %s version %s with alias %s", name, version.version, alias)
    elif alias is None:
        log.info("registered %s version %s as a backtest, without an alias", name, version.version)
    return {"model_name": name, "version": int(version.version), "alias": alias,
            "model_uri": f"models:/{name}/{version.version}", "metrics": evaluation["candidate"],
            "created": existing is None}


def same_weights_as_production(client: MlflowClient, registration: RegistrationPlan, weights_sha256: str, *,
                               dag_id: str, airflow_run_id: str) -> int | None:
    """The production version when its weights are ``weights_sha256`` (a retrain that changed nothing): such a
    candidate is never registered as a new version. None otherwise, without a production version, or when the
    production version is this DAG run's own (a re-run of register finds it again)."""
    from mlflow.exceptions import MlflowException

    try:
        production = client.get_model_version_by_alias(registration.model_name, registration.alias)
    except MlflowException:
        return None
    tags = production.tags or {}
    if (tags.get(VERSION_DAG_ID_TAG), tags.get(VERSION_RUN_ID_TAG)) == (dag_id, airflow_run_id):
        return None
    return int(production.version) if tags.get(WEIGHTS_SHA256_TAG) == weights_sha256 else None


# ---------------------------------------------------------------------------------------------
# promote, reject, rollback


def _registered_model(client: MlflowClient, model_name: str) -> Any:
    from mlflow.exceptions import MlflowException

    try:
        return client.get_registered_model(model_name)
    except MlflowException as err:
        raise RegistryError(f"no registered model {model_name!r} in this tracking store; check the name and "
                            "MLFLOW_TRACKING_URI") from err


def _version(client: MlflowClient, model_name: str, version: int | str) -> ModelVersion:
    from mlflow.exceptions import MlflowException

    _registered_model(client, model_name)
    try:
        return client.get_model_version(model_name, str(version))
    except MlflowException as err:
        known = sorted(int(v.version) for v in client.search_model_versions(f"name = {_quoted(model_name)}"))
        raise RegistryError(f"{model_name} has no version {version}; its versions are "
                            f"{', '.join(map(str, known)) or 'none'}") from err


def _alias_version(client: MlflowClient, model_name: str, alias: str) -> int | None:
    aliases = client.get_registered_model(model_name).aliases or {}
    return int(aliases[alias]) if alias in aliases else None


def _set_tags(client: MlflowClient, model_name: str, version: int, tags: dict[str, str]) -> None:
    for key, value in tags.items():
        client.set_model_version_tag(model_name, str(version), key, value)


def _promotion_tags(*, actor: str, at: str, reason: str, details: dict[str, Any] | None,
                    replaced_version: int | None) -> dict[str, str]:
    # Every tag is written each time (details as "{}" when none): a version promoted twice never shows
    # the first promotion's details beside the second one's reason.
    return {PROMOTED_BY_TAG: actor, PROMOTED_AT_TAG: at, PROMOTION_REASON_TAG: reason,
            REPLACED_VERSION_TAG: str(replaced_version) if replaced_version is not None else "none",
            PROMOTION_DETAILS_TAG: json.dumps(details or {}, sort_keys=True, default=str)}


def _history_field(text: str, limit: int | None = None) -> str:
    flat = " ".join(str(text).split())
    return flat if limit is None or len(flat) <= limit else flat[: limit - 1] + "…"


def _history_line(entry: dict[str, Any]) -> str:
    replaced = entry.get("replaced_version")
    return "\t".join([_history_field(entry["at"]), str(entry["version"]), str(replaced) if replaced is not None else "-",
                      _history_field(entry["by"]), _history_field(entry["reason"], PROMOTION_HISTORY_REASON_CHARS)])


def read_promotion_history(tags: dict[str, str]) -> list[dict[str, Any]]:
    """The model's moves, oldest first (from the compact tag, else the JSON tag written before it)."""
    entries: list[dict[str, Any]] = []
    if PROMOTION_HISTORY_TAG in tags:
        for line in tags[PROMOTION_HISTORY_TAG].splitlines():
            parts = line.split("\t")
            if len(parts) == 5 and parts[1].isdigit():
                entries.append({"at": parts[0], "version": int(parts[1]),
                                "replaced_version": int(parts[2]) if parts[2].isdigit() else None,
                                "by": parts[3], "reason": parts[4]})
        return entries
    try:
        old = json.loads(tags.get(PROMOTION_LOG_TAG, "[]"))
    except json.JSONDecodeError:
        return []
    return [e for e in old if isinstance(e, dict) and {"at", "version", "by", "reason"} <= set(e)]


def _log_promotion(client: MlflowClient, promotion: Promotion) -> None:
    """Append to the model's promotion history (read, append, write: moves are rare and one at a time)."""
    model = client.get_registered_model(promotion.model_name)
    tags = dict(model.tags or {})
    entries = read_promotion_history(tags)
    entries.append({"version": promotion.version, "replaced_version": promotion.replaced_version,
                    "at": promotion.at, "by": promotion.actor, "reason": promotion.reason})
    client.set_registered_model_tag(promotion.model_name, PROMOTION_HISTORY_TAG,
                                    "\n".join(_history_line(e) for e in entries[-PROMOTION_HISTORY_LENGTH:]))
    if PROMOTION_LOG_TAG in tags:  # carried over into the compact history: the long JSON goes
        client.delete_registered_model_tag(promotion.model_name, PROMOTION_LOG_TAG)


def _recorded_promotion(model_name: str, version: ModelVersion, *, alias: str, previous_alias: str) -> Promotion:
    tags = version.tags
    replaced = tags.get(REPLACED_VERSION_TAG, "none")
    return Promotion(model_name=model_name, version=int(version.version), alias=alias, previous_alias=previous_alias,
                     replaced_version=int(replaced) if replaced.isdigit() else None, moved=False,
                     actor=tags.get(PROMOTED_BY_TAG, ""), at=tags.get(PROMOTED_AT_TAG, ""),
                     reason=tags.get(PROMOTION_REASON_TAG, ""))


def promote(client: MlflowClient, model_name: str, version: int | str, *, actor: str, reason: str,
            details: dict[str, Any] | None = None, champion_alias: str = DEFAULT_CHAMPION_ALIAS,
            previous_alias: str = DEFAULT_PREVIOUS_ALIAS, team: str | None = None) -> Promotion:
    """Move ``champion_alias`` to ``version`` and the version it leaves to ``previous_alias``, and tag
    ``version`` with who, when and why. When ``version`` already is the champion nothing moves
    (``moved`` False); the tags of an interrupted promotion are completed then. With ``team`` (under
    a policy), refused unless that team owns the model."""
    check_owner(_registered_model(client, model_name), team, action="promote")
    target = _version(client, model_name, version)
    number = int(target.version)
    current = _alias_version(client, model_name, champion_alias)
    if current == number:
        if PROMOTED_AT_TAG in target.tags:
            log.info("%s version %s already holds %s: nothing moves", model_name, number, champion_alias)
            return _recorded_promotion(model_name, target, alias=champion_alias, previous_alias=previous_alias)
        # The aliases moved but the tags were not written (the promotion was interrupted): complete it.
        replaced = _alias_version(client, model_name, previous_alias)
        at = now_utc()
        _set_tags(client, model_name, number, _promotion_tags(actor=actor, at=at, reason=reason, details=details,
                                                              replaced_version=replaced))
        completed = Promotion(model_name=model_name, version=number, alias=champion_alias,
                              previous_alias=previous_alias, replaced_version=replaced, moved=False, actor=actor,
                              at=at, reason=reason)
        _log_promotion(client, completed)
        return completed
    # The previous alias first: if the second call never happens, the champion has not changed yet
    # and a retry finishes the move; the other order could lose the replaced version.
    if current is not None:
        client.set_registered_model_alias(model_name, previous_alias, str(current))
    client.set_registered_model_alias(model_name, champion_alias, str(number))
    at = now_utc()
    _set_tags(client, model_name, number, _promotion_tags(actor=actor, at=at, reason=reason, details=details,
                                                          replaced_version=current))
    log.info("promoted %s version %s to %s (%s now: %s) by %s: %s", model_name, number, champion_alias,
             previous_alias, current if current is not None else "none", actor, reason)
    promotion = Promotion(model_name=model_name, version=number, alias=champion_alias, previous_alias=previous_alias,
                          replaced_version=current, moved=True, actor=actor, at=at, reason=reason)
    _log_promotion(client, promotion)
    return promotion


def promote_once(client: MlflowClient, model_name: str, version: int | str, *, actor: str, reason: str,
                 details: dict[str, Any] | None = None, champion_alias: str = DEFAULT_CHAMPION_ALIAS,
                 previous_alias: str = DEFAULT_PREVIOUS_ALIAS, team: str | None = None) -> Promotion:
    """The DAG's promotion: a version is promoted by its run at most once. A re-run of the task after
    the version was promoted (and maybe replaced or rolled back since) moves nothing; so does one for
    a version a person rejected."""
    check_owner(_registered_model(client, model_name), team, action="promote")
    target = _version(client, model_name, version)
    if PROMOTED_AT_TAG in target.tags or target.tags.get(REJECTED_TAG) == "true":
        current = _alias_version(client, model_name, champion_alias)
        log.info("%s version %s was %s before: nothing moves (%s is version %s)", model_name, target.version,
                 "rejected" if PROMOTED_AT_TAG not in target.tags else "promoted", champion_alias,
                 current if current is not None else "none")
        return _recorded_promotion(model_name, target, alias=champion_alias, previous_alias=previous_alias)
    return promote(client, model_name, version, actor=actor, reason=reason, details=details,
                   champion_alias=champion_alias, previous_alias=previous_alias, team=team)


def reject(client: MlflowClient, model_name: str, version: int | str, *, actor: str, reason: str) -> None:
    """Record that ``version`` must not be promoted; its aliases (challenger) stay as they are."""
    target = _version(client, model_name, version)
    _set_tags(client, model_name, int(target.version),
              {REJECTED_TAG: "true", REJECTED_BY_TAG: actor, REJECTED_AT_TAG: now_utc(), REJECTION_REASON_TAG: reason})
    log.info("%s version %s rejected by %s: %s", model_name, target.version, actor, reason)


def rollback(client: MlflowClient, model_name: str, *, actor: str, reason: str,
             champion_alias: str = DEFAULT_CHAMPION_ALIAS, previous_alias: str = DEFAULT_PREVIOUS_ALIAS,
             team: str | None = None) -> Promotion:
    """The production alias back to the previous version; the version it leaves takes the previous
    alias (so a second rollback undoes the first). The restored version gets the promotion tags, the
    demoted one the rollback tags. With ``team``, refused unless that team owns the model."""
    check_owner(_registered_model(client, model_name), team, action="rollback")
    current = _alias_version(client, model_name, champion_alias)
    previous = _alias_version(client, model_name, previous_alias)
    if previous is None:
        raise RegistryError(f"{model_name} has no {previous_alias!r} version to roll back to; promote a version "
                            f"with `trainpipe promote {model_name} VERSION`")
    if current is None:
        raise RegistryError(f"{model_name} has no {champion_alias!r} version to roll back from; promote a version "
                            f"with `trainpipe promote {model_name} VERSION`")
    if current == previous:
        raise RegistryError(f"{model_name}: {champion_alias} and {previous_alias} are both version {current}; "
                            f"promote the version you want with `trainpipe promote {model_name} VERSION`")
    # The production alias first: it is what serving reads; the previous alias follows.
    client.set_registered_model_alias(model_name, champion_alias, str(previous))
    client.set_registered_model_alias(model_name, previous_alias, str(current))
    at = now_utc()
    _set_tags(client, model_name, previous, _promotion_tags(actor=actor, at=at, reason=f"rollback: {reason}",
                                                            details={"rollback_of": current}, replaced_version=current))
    _set_tags(client, model_name, current,
              {ROLLED_BACK_BY_TAG: actor, ROLLED_BACK_AT_TAG: at, ROLLBACK_REASON_TAG: reason})
    log.info("rolled %s back: %s is version %s again (%s: version %s) by %s: %s", model_name, champion_alias,
             previous, previous_alias, current, actor, reason)
    promotion = Promotion(model_name=model_name, version=previous, alias=champion_alias, previous_alias=previous_alias,
                          replaced_version=current, moved=True, actor=actor, at=at, reason=f"rollback: {reason}")
    _log_promotion(client, promotion)
    return promotion


# ---------------------------------------------------------------------------------------------
# reading


def describe(client: MlflowClient, model_name: str, *, last_promotions: int = 5) -> ModelSummary:
    """Every alias of ``model_name`` with its version, and the last promotions (newest first)."""
    model = _registered_model(client, model_name)
    aliases = {alias: int(v) for alias, v in sorted((model.aliases or {}).items())}
    versions = client.search_model_versions(f"name = {_quoted(model_name)}")
    by_version: dict[int, list[str]] = {}
    for alias, number in aliases.items():
        by_version.setdefault(number, []).append(alias)
    aliased = []
    for v in sorted(versions, key=lambda v: int(v.version), reverse=True):
        number = int(v.version)
        if number in by_version:
            aliased.append(VersionSummary(
                version=number, aliases=tuple(by_version[number]), run_id=v.run_id,
                created_at=datetime.fromtimestamp(v.creation_timestamp / 1000, UTC).isoformat(
                    timespec="seconds"),
                dag_id=v.tags.get(VERSION_DAG_ID_TAG), airflow_run_id=v.tags.get(VERSION_RUN_ID_TAG),
                metrics={k: val for k, val in sorted(v.tags.items()) if k.startswith("holdout_")},
                rejected=v.tags.get(REJECTED_TAG) == "true"))
    entries = read_promotion_history(dict(model.tags or {}))
    promotions = [PromotionRecord(version=e["version"], at=e["at"], by=e["by"], reason=e["reason"],
                                  replaced_version=e["replaced_version"]) for e in reversed(entries)]
    return ModelSummary(name=model_name, version_count=len(versions), aliases=aliases, aliased_versions=tuple(aliased),
                        promotions=tuple(promotions[:last_promotions]),
                        rejected_versions=tuple(sorted(int(v.version) for v in versions
                                                       if v.tags.get(REJECTED_TAG) == "true")))


# ---------------------------------------------------------------------------------------------
# the DAG's reason for a promotion


def dag_actor(dag_id: str, airflow_run_id: str) -> str:
    """Who promotes when no person does: the DAG run."""
    return f"airflow DAG {dag_id} (run {airflow_run_id})"


def gate_summary(gates: list[dict[str, Any]]) -> str:
    """One line from evaluate's gate outcomes: ``gates passed (3/3): auc >= 0.80: 0.9123; ...``."""
    if not gates:
        return "no gates configured"
    passed = sum(1 for g in gates if g["passed"])
    verdict = "gates passed" if passed == len(gates) else "gates failed"
    parts = []
    for g in gates:
        # A relative gate says what it compared with: "+0.556% vs champion", or "no champion yet".
        value = f"{g['value']:.4f}" if g.get("note") == "absolute" else f"{g['value']:.4f} ({g['note']})"
        parts.append(f"{g['gate']}: {value}{'' if g['passed'] else ' FAIL'}")
    return f"{verdict} ({passed}/{len(gates)}): " + "; ".join(parts)
