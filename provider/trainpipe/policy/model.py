"""The platform policy file: its models (they also give its JSON Schema), loading, and a spec's team.

The policy is a YAML file the platform owns, outside the specs folder, named by ``TRAINPIPE_POLICY``.
It is read with the spec loader (``yaml.safe_load`` semantics, the same limits), so its own errors
are located (``policy.yaml:12:7: teams.risk.kubernetes.images: ...``). A list left out places no
restriction; an empty list allows nothing. A broken policy refuses every spec (fail closed).
"""

from __future__ import annotations

import difflib
import hashlib
import os
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from trainpipe.errors import SpecError, SpecProblem
from trainpipe.plan.costs import PriceTable
from trainpipe.policy import globs
from trainpipe.settings import POLICY_ENV, Settings
from trainpipe.spec.loader import FieldPath, LoadedYaml, load_yaml_text, read_spec_text
from trainpipe.spec.sections.kubernetes import Quantity
from trainpipe.spec.types import Duration
from trainpipe_trainer.config import BUILT_IN_MODEL_TYPES, MODEL_TYPE_PATTERN

# What the DAGs' Airflow roles may be given on a DAG (the FAB auth manager's DAG permissions).
DAG_PERMISSIONS = ("can_read", "can_edit", "can_delete")
_NAME = r"^[A-Za-z][A-Za-z0-9_.-]*$"


class PolicyError(SpecError):
    """The policy file itself is invalid; every spec is refused with its located problems."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


Names = list[str] | None


class KubernetesRules(_Model):
    images: Names = Field(default=None, description="Glob patterns of the trainer images allowed.",
                          examples=[["ghcr.io/trainpipe/trainer:*"]])
    namespaces: Names = Field(default=None, description="Namespaces the pods may run in.", examples=[["ml-training"]])
    kubernetes_conn_ids: Names = Field(default=None, description="Airflow Kubernetes connections (effective value: "
                                       "kubernetes_default when a spec names none).", examples=[["kubernetes_default"]])
    service_accounts: Names = Field(default=None, description="Service accounts of the pods (a spec naming none "
                                    "gets the namespace's `default`).", examples=[["trainer"]])
    secrets: Names = Field(default=None, description="Kubernetes Secrets a spec may name in secret_env, "
                           "env_from_secrets and image_pull_secrets.", examples=[["mlflow-credentials"]])
    priority_classes: Names = Field(default=None, description="PriorityClasses of the pods (none is always allowed).",
                                    examples=[["ml-batch"]])
    queues: Names = Field(default=None, description="Kueue LocalQueues a spec may name in training.kubernetes.queue.",
                          examples=[["risk-gpu"]])
    max_gpus_per_pod: int | None = Field(default=None, ge=0, description="GPUs per pod at most.", examples=[8])
    gpu_resources: Names = Field(default=None, description="Globs of the accelerator resources a pod with GPUs may "
                                 "request (resources.gpu_resource, its default judged too); the spec stage admits only "
                                 "accelerator device plugins' resources in any case.",
                                 examples=[["nvidia.com/gpu", "nvidia.com/mig-1g.*"]])
    max_memory_per_pod: Quantity | None = Field(
        default=None, description="Memory per pod at most: resources.memory, resources.limits.memory, "
        "on_oom.max_memory (the most a retry after an OOM kill grows to) and shm_size (memory-backed).",
        examples=["512Gi"])
    max_cpu_per_pod: Quantity | None = Field(
        default=None, description="CPUs per pod at most: resources.cpu and resources.limits.cpu.", examples=["32"])
    node_labels: Names = Field(default=None, description="Glob patterns of `key=value` node labels the pods may "
                               "select: training.kubernetes.node_selector, each capacity placement's, and node "
                               "affinity (`In` judges each value; `Exists`, `Gt` and `Lt` judge `key=*`, so they "
                               "need a pattern allowing any value of the key; `NotIn` and `DoesNotExist` only keep "
                               "pods off nodes and are not judged).",
                               examples=[["karpenter.sh/capacity-type=*", "nvidia.com/gpu.product=*"]])
    tolerations: Names = Field(default=None, description="Glob patterns of the taint keys the pods may tolerate "
                               "(training.kubernetes.tolerations and each capacity placement's); a toleration "
                               "without a key (every taint) is judged as `*`.", examples=[["nvidia.com/gpu", "spot"]])
    label_keys: Names = Field(default=None, description="Glob patterns of the pod label keys a spec may set in "
                              "training.kubernetes.labels (keys in the domains the cluster's controllers read are "
                              "refused whatever this says).", examples=[["cost-center", "risk.example.com/*"]])
    annotation_keys: Names = Field(default=None, description="Glob patterns of the pod annotation keys a spec may "
                                   "set in training.kubernetes.annotations.", examples=[["team"]])
    max_nodes: int | None = Field(default=None, ge=1, description="training.distributed.nnodes at most.", examples=[4])


class DataRules(_Model):
    uris: Names = Field(default=None, description="Glob patterns of the data URIs allowed, relative ones resolved "
                        "against the storage root (TRAINPIPE_STORAGE_ROOT); checked at the spec and before reading.",
                        examples=[["s3://risk-data/**", "demo/**"]])
    conn_ids: Names = Field(default=None, description="Airflow connections data.conn_id may name; when listed, an "
                            "object-store URI without conn_id (the worker's own credentials) is refused.",
                            examples=[["aws_risk"]])


class NotifyRules(_Model):
    conn_ids: Names = Field(default=None, description="SMTP and Slack connections (effective values count: "
                            "smtp_default, slack_api_default).", examples=[["smtp_default"]])
    email_domains: Names = Field(default=None, description="Domains (glob patterns) of notify.email.to and "
                                 "from_email addresses.", examples=[["example.com"]])
    from_addresses: Names = Field(default=None, description="Sender addresses (glob patterns) a spec may give as "
                                  "notify.email.from_email: the mail says it comes from there, so without this rule a "
                                  "spec signs its approval mails as anyone at an allowed domain.",
                                  examples=[["ml-bot@example.com", "risk-*@example.com"]])
    slack_channels: Names = Field(default=None, description="Slack channels.", examples=[["#risk-ml"]])


class LimitRules(_Model):
    min_schedule_interval: Duration | None = Field(default=None, description="Shortest time between two scheduled "
                                                   "runs (cron and presets; asset schedules are not bounded).",
                                                   examples=["1h"])
    max_epochs: int | None = Field(default=None, ge=1, description="training.epochs, tuning.trial_epochs and the "
                                   "maximum of a run parameter `epochs`.", examples=[200])
    max_trials: int | None = Field(default=None, ge=1, description="tuning.n_trials at most.", examples=[200])
    max_parallel_trials: int | None = Field(default=None, ge=1, description="tuning.max_parallel at most.", examples=[8])
    max_nproc_per_node: int | None = Field(default=None, ge=1, description="training.distributed.nproc_per_node.",
                                           examples=[8])
    max_retries: int | None = Field(default=None, ge=0, description="retries (per task) at most, "
                                    "training.kubernetes.max_pod_restarts (a multi-node Job's pod restarts) and "
                                    "training.preemption.max_restarts (relaunches after a preemption).",
                                    examples=[3])
    max_priority: Literal["low", "normal", "high"] | None = Field(
        default=None, description="A spec's `priority` at most (low < normal < high).", examples=["normal"])
    max_deadline_within: Duration | None = Field(
        default=None, description="notify.deadline.within at most: how late a run may be before someone is told.",
        examples=["12h"])
    max_cache_age: Duration | None = Field(
        default=None, description="training.cache.max_age at most: how old a registered version may be and still "
        "stand in for a training on the same inputs.", examples=["7d"])


class AirflowRules(_Model):
    pool: str | None = Field(default=None, description="Airflow pool of the train and trial tasks (it must exist).",
                             examples=["risk_gpu"])
    execution_timeout: Duration | None = Field(default=None, description="execution_timeout of every task but the "
                                               "approval (which waits without a worker).", examples=["12h"])
    max_active_runs: int | None = Field(default=None, ge=1, description="Runs of one DAG at once (trainpipe's own "
                                        "cap is 1).", examples=[1])
    access_control: dict[str, list[str]] | None = Field(
        default=None, description=f"Airflow roles and their DAG permissions ({', '.join(DAG_PERMISSIONS)}); "
        "applied by the FAB auth manager, ignored by the SimpleAuthManager.",
        examples=[{"risk-ml": ["can_read", "can_edit"]}])

    @field_validator("access_control")
    @classmethod
    def _known_permissions(cls, value: dict[str, list[str]] | None) -> dict[str, list[str]] | None:
        for role, permissions in (value or {}).items():
            unknown = [p for p in permissions if p not in DAG_PERMISSIONS]
            if unknown:
                raise ValueError(f"role {role!r}: unknown permission(s) {', '.join(map(repr, unknown))}; use "
                                 f"{', '.join(DAG_PERMISSIONS)}")
        return value


class ModelRules(_Model):
    # Unlike the other rules, left out means the built-ins: a family is code the trainer imports and runs on the
    # platform's workers and nodes, so a team gets another one only when the platform names it.
    families: list[str] = Field(
        default_factory=lambda: list(BUILT_IN_MODEL_TYPES),
        description="Model families (training.model.type) the team may use; left out: the built-in ones "
        f"({', '.join(BUILT_IN_MODEL_TYPES)}). A family not built in must also be installed where it trains (the "
        "trainer image, or the Airflow workers for the local launcher).", examples=[["mlp", "acme_tabnet"]])
    hub: bool = Field(
        default=False,
        description="training.model.pretrained may name a Hugging Face Hub model (hf://owner/name), which the "
        "trainer then downloads: code and weights from outside the platform. Off by default; without a policy a "
        "Hub model is always refused. A pretrained folder in storage follows data.uris instead.",
        examples=[False])

    @field_validator("families")
    @classmethod
    def _family_names(cls, families: list[str]) -> list[str]:
        import re

        wrong = [name for name in families if not re.match(MODEL_TYPE_PATTERN, name)]
        if wrong:
            raise ValueError(f"{', '.join(map(repr, wrong))}: a family is named as specs name it (lowercase letters, "
                             "digits and _), never a module or a path")
        return families


class TeamPolicy(_Model):
    folders: list[str] = Field(default_factory=list, description="Glob patterns of spec paths relative to the specs "
                               "root (TRAINPIPE_DAG_CONFIGS) that belong to the team.", examples=[["risk/**"]])
    pipeline_id_prefix: str | None = Field(default=None, description="Every pipeline_id of the team starts with it.",
                                           examples=["risk_"])
    model_name_prefix: str | None = Field(default=None, description="Every registration.model_name starts with it.",
                                          examples=["risk_"])
    testing: bool = Field(default=False, description="training.testing (fault injection) is allowed.",
                          examples=[False])
    kubernetes: KubernetesRules = Field(default_factory=KubernetesRules, description="What pods may use.")
    data: DataRules = Field(default_factory=DataRules, description="Where data may be read from.")
    notify: NotifyRules = Field(default_factory=NotifyRules, description="Where messages may go.")
    limits: LimitRules = Field(default_factory=LimitRules, description="Caps on schedule and size.")
    airflow: AirflowRules = Field(default_factory=AirflowRules, description="What each DAG of the team gets.")
    models: ModelRules = Field(default_factory=ModelRules, description="Which model families the team's specs use, "
                               "and whether pretrained weights may come from the Hugging Face Hub.")

    @field_validator("folders")
    @classmethod
    def _relative_folders(cls, folders: list[str]) -> list[str]:
        return _relative_globs(folders, "folders")


def _relative_globs(patterns: list[str], key: str) -> list[str]:
    for pattern in patterns:
        if pattern.startswith("/") or ".." in pattern.split("/"):
            raise ValueError(f"{pattern!r}: {key} are globs relative to the specs root, without '..'")
    return patterns


class CostsPolicy(_Model):
    gpu_hour: dict[str, float] | None = Field(default=None, description="Price of one GPU hour: `default`, and per "
                                              "GPU resource name (nvidia.com/gpu).",
                                              examples=[{"default": 2.5, "nvidia.com/gpu": 2.5}])
    cpu_hour: float | None = Field(default=None, ge=0, description="Price of one CPU hour.", examples=[0.04])
    spot_discount: float | None = Field(default=None, ge=0, le=1, description="Share taken off on spot capacity.",
                                        examples=[0.6])

    @field_validator("gpu_hour")
    @classmethod
    def _prices(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        if value is None:
            return value
        if "default" not in value:
            raise ValueError("give a `default` price, used for GPU resources not listed")
        negative = [name for name, price in value.items() if price < 0]
        if negative:
            raise ValueError(f"prices must be >= 0: {', '.join(negative)}")
        return value


class PolicySpec(_Model):
    default_team: str | None = Field(default=None, description="The team of a spec in no team's folder; null: such "
                                     "a spec is refused.", examples=[None, "platform"])
    teams: dict[str, TeamPolicy] = Field(min_length=1, description="Teams by name (the DAG owner and its "
                                         "`team:<name>` tag).")
    platform_defaults: list[str] = Field(
        default_factory=list, description="Globs (relative to the specs root) of the _defaults.yaml files the platform "
        "owns: they apply to every spec below them. Any other _defaults.yaml applies only to specs of the team whose "
        "folders it is in (a root one to no team's).", examples=[["_defaults.yaml"]])
    costs: CostsPolicy | None = Field(default=None, description="Prices, for cost estimates.")

    @field_validator("platform_defaults")
    @classmethod
    def _relative_defaults(cls, patterns: list[str]) -> list[str]:
        return _relative_globs(patterns, "platform_defaults")

    @field_validator("teams")
    @classmethod
    def _team_names(cls, teams: dict[str, TeamPolicy]) -> dict[str, TeamPolicy]:
        import re

        for name in teams:
            if not re.match(_NAME, name):
                raise ValueError(f"team name {name!r} must start with a letter and use letters, digits, '_', '.', '-'")
        return teams

    @model_validator(mode="after")
    def _consistent(self) -> PolicySpec:
        if self.default_team is not None and self.default_team not in self.teams:
            raise ValueError(f"default_team {self.default_team!r} is not a team; name one of "
                             f"{', '.join(sorted(self.teams))}, or null")
        for kind in ("pipeline_id_prefix", "model_name_prefix"):
            owners = sorted((getattr(team, kind), name) for name, team in self.teams.items() if getattr(team, kind))
            for (first, first_team), (second, second_team) in pairwise(owners):
                if second.startswith(first):
                    raise ValueError(f"{kind} {second!r} of team {second_team} starts with {first!r} of team "
                                     f"{first_team}: the two teams' names could collide; make neither a prefix of "
                                     "the other")
        return self


_MODELS: dict[str, type[BaseModel]] = {
    "": PolicySpec, "team": TeamPolicy, "kubernetes": KubernetesRules, "data": DataRules, "notify": NotifyRules,
    "limits": LimitRules, "airflow": AirflowRules, "costs": CostsPolicy, "models": ModelRules,
}


def _model_at(path: FieldPath) -> type[BaseModel] | None:
    if not path:
        return PolicySpec
    if path[0] == "teams":
        if len(path) == 2:
            return TeamPolicy
        return _MODELS.get(str(path[2])) if len(path) == 3 else None
    return _MODELS.get(str(path[0])) if len(path) == 1 else None


def _problem(loaded: LoadedYaml, error: dict[str, Any]) -> SpecProblem:
    path: FieldPath = tuple(error["loc"])
    if error["type"] == "extra_forbidden":
        model = _model_at(path[:-1])
        valid = list(model.model_fields) if model else []
        close = difflib.get_close_matches(str(path[-1]), valid, n=1, cutoff=0.5)
        hint = f"did you mean `{close[0]}`?" if close else "valid keys: " + ", ".join(valid)
        return loaded.problem(path, f"unknown key; {hint}")
    if error["type"] == "missing":
        return loaded.problem(path, "required field is missing; add it")
    message = str(error["msg"]).removeprefix("Value error, ")
    if error["type"] != "value_error" and not isinstance(error.get("input"), dict | list):
        message += f", got {error.get('input')!r}"
    return loaded.problem(path, message)


@dataclass(frozen=True, slots=True)
class Policy:
    """A loaded, valid policy, and ``digest``: the sha256 of its text (the plan cache's key part)."""

    spec: PolicySpec
    file: str
    digest: str

    def _teams_matching(self, relative_path: str) -> list[str]:
        """The teams whose folders match ``relative_path``, each once, in policy order."""
        return list(dict.fromkeys(name for pattern, name in _folder_patterns(self) if pattern.match(relative_path)))

    def team_for(self, relative_path: str | None) -> tuple[str | None, str]:
        """The team of a spec at ``relative_path`` (posix, relative to the specs root; None when the
        spec is outside it): (name, "") or (None, why none)."""
        matched = self._teams_matching(relative_path) if relative_path is not None else []
        if len(matched) == 1:
            return matched[0], ""
        if len(matched) > 1:
            return None, (f"the file is in the folders of several teams ({', '.join(matched)}) in the policy "
                          f"{self.file}; the platform must make their `folders` disjoint")
        if self.spec.default_team is not None:
            return self.spec.default_team, ""
        where = f"{relative_path!r} matches no team's folders" if relative_path is not None else \
            "the file is outside the specs root (TRAINPIPE_DAG_CONFIGS)"
        return None, (f"refused by policy: {where} and the policy {self.file} has no default_team; move the spec "
                      "into your team's folder")


    def defaults_problem(self, relative_path: str, team: str) -> str | None:
        """Why the ``_defaults.yaml`` at ``relative_path`` (posix, relative to the specs root) may not apply to a
        spec of ``team`` (None when it may): a defaults file is its folder's team's, or the platform's when
        ``platform_defaults`` names it. Otherwise a file in a shared folder would rewrite another team's specs
        (mail their gate tables elsewhere, approve on a timeout), or refuse them all with one value."""
        if any(globs.compiled(pattern).match(relative_path) for pattern in self.spec.platform_defaults):
            return None
        # By the folders alone: default_team is for specs in no team's folder, and would hand it a root file
        # that every team's specs lie under.
        owners = self._teams_matching(relative_path)
        if owners == [team]:
            return None
        whose = (f"team {owners[0]}'s folders" if len(owners) == 1 else
                 f"the folders of teams {', '.join(owners)}" if owners else "no team's folders")
        return (f"this _defaults.yaml is in {whose}, so it may not set values of team {team}'s specs; move the "
                f"defaults into team {team}'s own folder, or the platform lists the file in `platform_defaults` of "
                f"the policy {self.file}")


_FOLDERS: dict[str, list[tuple[Any, str]]] = {}


def _folder_patterns(policy: Policy) -> list[tuple[Any, str]]:
    """Every team's folder globs compiled once per policy (a parse looks up each spec's team)."""
    found = _FOLDERS.get(policy.digest)
    if found is None:
        found = [(globs.compiled(folder), name) for name, team in policy.spec.teams.items() for folder in team.folders]
        _FOLDERS.clear()
        _FOLDERS[policy.digest] = found
    return found


def load_policy_text(text: str, file: str) -> Policy:
    """Validate a policy's text; ``PolicyError`` locates every problem in it."""
    try:
        loaded = load_yaml_text(text, file)
    except SpecError as err:
        raise PolicyError(err.problems) from None
    if not isinstance(loaded.data, dict):
        raise PolicyError([loaded.problem((), "a policy is a YAML mapping with `teams:` (and `default_team:`)")])
    try:
        spec = PolicySpec.model_validate(loaded.data)
    except ValidationError as err:
        raise PolicyError([_problem(loaded, e) for e in err.errors()]) from None
    return Policy(spec=spec, file=file, digest=hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest())


_LOADED: dict[tuple[str, str], Policy] = {}


def read_policy_text(path: Path) -> str:
    """The policy file's text; ``PolicyError`` (named by its file name only: no paths of this machine
    in messages) when it cannot be read."""
    try:
        return read_spec_text(path, path.name)
    except OSError as err:
        raise PolicyError([SpecProblem(path.name, None, None, "", (
            f"the policy named by {POLICY_ENV} cannot be read ({err.strerror or type(err).__name__}); the platform "
            "must fix it or unset the variable"))]) from None


def load_policy(path: Path, text: str | None = None) -> Policy:
    """The policy at ``path`` (``text``: its content, when already read); validated once per process
    per text."""
    if text is None:
        text = read_policy_text(path)
    key = (str(path), text)
    policy = _LOADED.get(key)
    if policy is None:
        policy = load_policy_text(text, path.name)
        _LOADED.clear()  # one policy in force at a time: never grows
        _LOADED[key] = policy
    return policy


def policy_in_force(settings: Settings) -> Policy | None:
    """The policy in force (``settings.policy_path``), or None without one; ``PolicyError`` when broken."""
    path = settings.policy_path
    return load_policy(path) if path else None


def load_price_table(path: str | os.PathLike[str] | None) -> PriceTable | None:
    """The price table of the policy file at ``path`` (the settings' ``policy_path``); None without a file or
    without ``costs:`` in it (runs then record device-hours, no money). ``PolicyError`` when broken."""
    if not path:
        return None
    costs = load_policy(Path(path)).spec.costs
    if costs is None:
        return None
    return PriceTable(gpu_hour=dict(costs.gpu_hour or {}), cpu_hour=costs.cpu_hour or 0.0,
                      spot_discount=costs.spot_discount or 0.0)


def relative_spec_path(spec_path: Path, root: Path) -> str | None:
    return PurePosixPath(spec_path.relative_to(root).as_posix()).as_posix() if spec_path.is_relative_to(root) else None


POLICY_SCHEMA_PATH = Path(__file__).resolve().parent.parent / "spec" / "policy_schema.json"
POLICY_SCHEMA_ID = "https://trainpipe.dev/schema/platform-policy.json"


def policy_json_schema_text() -> str:
    """The published JSON Schema of a policy (draft 2020-12), committed beside the spec's."""
    import json

    schema = PolicySpec.model_json_schema(mode="validation")
    return json.dumps({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": POLICY_SCHEMA_ID,
        "title": "trainpipe platform policy",
        "description": "What each team's specs may use (TRAINPIPE_POLICY); owned by the platform, outside the "
                       "specs folder.",
        **{k: v for k, v in schema.items() if k not in {"title", "description"}},
    }, indent=2, sort_keys=True) + "\n"
