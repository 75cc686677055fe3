"""A validated spec judged against its team's rules: every violation a located problem of the spec.

Effective values are judged, not only written ones: a default (``kubernetes_conn_id:
kubernetes_default``, ``notify.email.conn_id: smtp_default``, the namespace's ``default`` service
account), a value from a ``_defaults.yaml`` and a value the spec wrote are all the same to the
policy, which always wins. A problem points at the key when it is written (in the spec or in the
defaults file it came from), else at the nearest section that is.
"""

from __future__ import annotations

import functools
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from typing import Any

from trainpipe import uris
from trainpipe.errors import SpecProblem
from trainpipe.plan.model import (
    PRIORITY_WEIGHTS,
    TeamPlan,
    asset_key,
    model_asset_uri,
    priority_class_for,
    snapshot_asset_uri,
)
from trainpipe.policy import globs
from trainpipe.policy.model import Policy, TeamPolicy
from trainpipe.settings import FAULT_INJECTION_ENV
from trainpipe.spec.loader import FieldPath, LoadedYaml
from trainpipe.spec.sections.pipeline import PipelineSpec, param_bounds

# Fewest seconds between two runs of each preset (a month: February; a quarter: January to April).
_PRESET_SECONDS = {"@hourly": 3600, "@daily": 86400, "@weekly": 7 * 86400, "@monthly": 28 * 86400,
                   "@quarterly": 90 * 86400, "@yearly": 365 * 86400, "@annually": 365 * 86400}
# Fires of a cron expression looked at when its times of day alone do not prove it slow enough.
_CRON_FIRES_CHECKED = 2000


class _Judge:
    def __init__(self, loaded: LoadedYaml, team_name: str) -> None:
        self.loaded = loaded
        self.team = team_name
        self.problems: list[SpecProblem] = []

    def refuse(self, path: FieldPath, rule: str, value: Any, allowed: str) -> None:
        written = "" if tuple(path) in self.loaded.positions else " (not written in the spec: its default)"
        self.problems.append(self.loaded.problem(path, (
            f"not allowed by policy (team {self.team}, rule {rule}): {value!r}{written}; allowed: {allowed}")))

    def names(self, path: FieldPath, rule: str, value: str | None, allowed: list[str] | None, *,
              glob: bool = False) -> None:
        if allowed is None or value is None:
            return
        ok = globs.matches_any(value, allowed) if glob else value in allowed
        if not ok:
            self.refuse(path, rule, value, ", ".join(map(repr, allowed)) or "nothing (an empty list)")

    def at_most(self, path: FieldPath, rule: str, value: int | None, limit: int | None) -> None:
        if limit is not None and value is not None and value > limit:
            self.refuse(path, rule, value, f"at most {limit}")


def check_spec(spec: PipelineSpec, loaded: LoadedYaml, *, policy: Policy | None, team: str | None,
               storage_root: str, fault_injection: bool = False) -> list[SpecProblem]:
    """Every way ``spec`` (of ``team`` under ``policy``) goes beyond what the platform allows. Without a
    policy only fault injection is judged (allowed by ``fault_injection``, the platform's switch, alone)."""
    testing = spec.training.testing
    injects = (testing.inject_nan_at_step is not None or testing.crash_first_try_after_step is not None
               or testing.step_delay_seconds > 0)
    loops = _self_triggers(spec, loaded)
    if policy is None or team is None:
        problems = [*loops, *_local_outside_root(spec.data.uri, ("data", "uri"), loaded, storage_root)]
        problems.extend(_pretrained_without_policy(spec, loaded, storage_root))
        if injects and not fault_injection:
            problems.append(loaded.problem(("training", "testing"), (
                "fault injection is for trainpipe's own tests and is off on this platform; remove training.testing "
                f"(the platform enables it with {FAULT_INJECTION_ENV}=1, or per team with `testing: true` in its "
                "policy)")))
        return problems
    rules = policy.spec.teams[team]
    judge = _Judge(loaded, team)
    judge.problems.extend(loops)
    if injects and not rules.testing:
        judge.refuse(("training", "testing"), "testing", "fault injection", "none (the team's `testing` is false)")
    _identity(judge, spec, rules, policy)
    _kubernetes(judge, spec, rules)
    _data(judge, spec, rules, storage_root)
    _notify(judge, spec, rules)
    _limits(judge, spec, rules)
    _models(judge, spec, rules, storage_root)
    return judge.problems


PRETRAINED = ("training", "model", "pretrained")


def _models(judge: _Judge, spec: PipelineSpec, rules: TeamPolicy, storage_root: str) -> None:
    family = spec.training.model.type
    allowed = rules.models.families
    if family not in allowed:
        listed = ", ".join(map(repr, allowed)) or "nothing (an empty list)"
        if "families" not in rules.models.model_fields_set:
            listed += " (the built-in families; the platform allows others in the team's models.families)"
        judge.refuse(("training", "model", "type"), "models.families", family, listed)
    pretrained = spec.training.model.pretrained
    if pretrained is None:
        return
    if uris.is_hub(pretrained):
        if not rules.models.hub:
            judge.refuse(PRETRAINED, "models.hub", pretrained, "no Hugging Face Hub model (the team's models.hub is "
                         "false): a save_pretrained folder the team may read (data.uris), or the platform sets "
                         "models.hub: true")
        return
    # Weights in storage are read as data is: the same rules, judged the same way. The trainer reads them with no
    # connection of the spec's (pretrained has no conn_id): under data.conn_ids only the storage root's folders.
    _allowed_uri(judge, PRETRAINED, pretrained, rules, storage_root)
    _own_credentials(judge, PRETRAINED, pretrained, rules, storage_root)


def _pretrained_without_policy(spec: PipelineSpec, loaded: LoadedYaml, storage_root: str) -> list[SpecProblem]:
    """Without a policy, pretrained weights follow data.uri's rule (local folders under the storage root), and
    a Hub model is refused: only a platform policy can allow downloads from outside (models.hub)."""
    pretrained = spec.training.model.pretrained
    if pretrained is None:
        return []
    if uris.is_hub(pretrained):
        return [loaded.problem(PRETRAINED, (
            f"{pretrained!r} is a Hugging Face Hub model, which the trainer would download from outside the platform; "
            "without a platform policy none is allowed: a platform policy must set models.hub: true for the team "
            "(TRAINPIPE_POLICY), or put the save_pretrained folder under the storage root and name its path"))]
    return _local_outside_root(pretrained, PRETRAINED, loaded, storage_root)


def _self_triggers(spec: PipelineSpec, loaded: LoadedYaml) -> list[SpecProblem]:
    """An asset schedule on the pipeline's own snapshot or model: each run would queue the next, training
    without end and beyond any limits.min_schedule_interval. Compared as Airflow stores asset URIs."""
    schedule = spec.schedule
    if isinstance(schedule, str) or schedule is None:
        return []
    own = {asset_key(snapshot_asset_uri(spec.pipeline_id)): "snapshot",
           asset_key(model_asset_uri(spec.pipeline_id)): "model"}
    return [loaded.problem(("schedule", "assets", index), (
        f"{uri!r} is this pipeline's own {own[asset_key(uri)]} asset: each run would start the next, without end; "
        "schedule on another pipeline's asset, or use a cron schedule"))
        for index, uri in enumerate(schedule.assets) if asset_key(uri) in own]


def _local_outside_root(uri: str, at: FieldPath, loaded: LoadedYaml, storage_root: str) -> list[SpecProblem]:
    """Without a policy, local data (and pretrained weights, read as data) lies under the storage root: a path
    anywhere else on the worker (/etc/passwd, /proc/self/environ, the Airflow home) would be copied into a
    snapshot and its first line shown as "columns present". A policy's data.uris may allow other local paths
    (judged in _allowed_uri)."""
    if not uris.is_absolute(uri):
        return []  # relative: inside the root (the spec stage refuses one that climbs out)
    canonical = globs.canonical_uri(uri, storage_root)
    local = canonical.startswith("file://") if canonical is not None else uri.startswith("/") or uri.lower().startswith("file:")
    if not local:
        return []  # an object store, read by its connection
    root = storage_root.removeprefix("file://").rstrip("/") if storage_root.startswith("file://") else None
    path = canonical.removeprefix("file://") if canonical is not None else None
    if root is not None and path is not None and (path == root or path.startswith(root + "/")):
        return []
    return [loaded.problem(at, (
        f"{uri!r} is a local path outside the storage root; {uris.LOCAL_DATA_RULE}: {uris.LOCAL_DATA_FIX}"))]


def _identity(judge: _Judge, spec: PipelineSpec, rules: TeamPolicy, policy: Policy) -> None:
    if rules.pipeline_id_prefix and not spec.pipeline_id.startswith(rules.pipeline_id_prefix):
        judge.refuse(("pipeline_id",), "pipeline_id_prefix", spec.pipeline_id, f"ids starting with {rules.pipeline_id_prefix!r}")
    name = spec.registration.model_name
    if rules.model_name_prefix and not name.startswith(rules.model_name_prefix):
        judge.refuse(("registration", "model_name"), "model_name_prefix", name,
                     f"names starting with {rules.model_name_prefix!r}")
    # A team with no prefix of its own may still not write in another's: its id would knock the other team's
    # DAG out as a duplicate, and its model name would claim (register) or move (promote) the other's model.
    # (A name in its own prefix is in no other: the policy keeps prefixes disjoint.)
    for other, their in policy.spec.teams.items():
        if other == judge.team:
            continue
        if (not rules.pipeline_id_prefix and their.pipeline_id_prefix
                and spec.pipeline_id.startswith(their.pipeline_id_prefix)):
            judge.refuse(("pipeline_id",), "pipeline_id_prefix", spec.pipeline_id,
                         f"ids not starting with {their.pipeline_id_prefix!r} (team {other}'s prefix)")
        if not rules.model_name_prefix and their.model_name_prefix and name.startswith(their.model_name_prefix):
            judge.refuse(("registration", "model_name"), "model_name_prefix", name,
                         f"names not starting with {their.model_name_prefix!r} (team {other}'s prefix)")
    for index, tag in enumerate(spec.tags):
        # Any spelling a reader or filter would take for the team tag (" Team:search"); look-alike letters
        # and invisible characters never get here (spec.sections.pipeline refuses them in any tag).
        if tag.strip().lower().startswith("team:"):
            judge.refuse(("tags", index), "team tag", tag, f"none: trainpipe adds 'team:{judge.team}' itself")


def _kubernetes(judge: _Judge, spec: PipelineSpec, rules: TeamPolicy) -> None:
    section = spec.training.kubernetes
    k8s = rules.kubernetes
    base = ("training", "kubernetes")
    if section is not None:
        judge.names((*base, "image"), "kubernetes.images", section.image, k8s.images, glob=True)
        judge.names((*base, "namespace"), "kubernetes.namespaces", section.namespace, k8s.namespaces)
        judge.names((*base, "kubernetes_conn_id"), "kubernetes.kubernetes_conn_ids", section.kubernetes_conn_id,
                    k8s.kubernetes_conn_ids)
        judge.names((*base, "service_account"), "kubernetes.service_accounts", section.service_account or "default",
                    k8s.service_accounts)
        # The class the pods get: the written one, else the one a spec `priority` maps to (plan.priority_class_for).
        if section.priority_class is not None or spec.priority is None:
            judge.names((*base, "priority_class"), "kubernetes.priority_classes", section.priority_class,
                        k8s.priority_classes)
        else:
            judge.names(("priority",), "kubernetes.priority_classes", priority_class_for(spec.priority),
                        k8s.priority_classes)
        judge.names((*base, "queue"), "kubernetes.queues", section.queue, k8s.queues)
        for name, ref in section.secret_env.items():
            judge.names((*base, "secret_env", name), "kubernetes.secrets", ref.secret, k8s.secrets)
        for index, secret in enumerate(section.env_from_secrets):
            judge.names((*base, "env_from_secrets", index), "kubernetes.secrets", secret, k8s.secrets)
        for index, secret in enumerate(section.image_pull_secrets):
            judge.names((*base, "image_pull_secrets", index), "kubernetes.secrets", secret, k8s.secrets)
        judge.at_most((*base, "resources", "gpus"), "kubernetes.max_gpus_per_pod", section.resources.gpus,
                      k8s.max_gpus_per_pod)
        if section.resources.gpus:
            judge.names((*base, "resources", "gpu_resource"), "kubernetes.gpu_resources", section.resources.gpu_resource,
                        k8s.gpu_resources, glob=True)
        _memory(judge, section, k8s)
        _cpu(judge, section, k8s)
        _placement(judge, base, section.node_selector, section.tolerations, k8s)
        _affinity(judge, base, section.affinity, k8s)
        for key in section.labels:
            judge.names((*base, "labels", key), "kubernetes.label_keys", key, k8s.label_keys, glob=True)
        for key in section.annotations:
            judge.names((*base, "annotations", key), "kubernetes.annotation_keys", key, k8s.annotation_keys, glob=True)
        if section.capacity is not None:
            for kind in ("spot", "on_demand"):
                placement = getattr(section.capacity, kind)
                _placement(judge, (*base, "capacity", kind), placement.node_selector, placement.tolerations, k8s)
    judge.at_most(("training", "distributed", "nnodes"), "kubernetes.max_nodes", spec.training.distributed.nnodes,
                  k8s.max_nodes)


def _memory(judge: _Judge, section: Any, rules: Any) -> None:
    """Every memory a pod may ask for, the grown request of a retry after an OOM kill included."""
    base = ("training", "kubernetes")
    asked = [((*base, "resources", "memory"), section.resources.memory),
             ((*base, "resources", "limits", "memory"), section.resources.limits.memory)]
    if section.on_oom is not None:
        asked.append(((*base, "on_oom", "max_memory"), section.on_oom.max_memory))
    # /dev/shm is memory-backed: what it holds is the pod's memory too.
    asked.append(((*base, "shm_size"), section.shm_size))
    _per_pod_cap(judge, asked, rules.max_memory_per_pod, "kubernetes.max_memory_per_pod")


def _cpu(judge: _Judge, section: Any, rules: Any) -> None:
    base = ("training", "kubernetes")
    asked = [((*base, "resources", "cpu"), section.resources.cpu),
             ((*base, "resources", "limits", "cpu"), section.resources.limits.cpu)]
    _per_pod_cap(judge, asked, rules.max_cpu_per_pod, "kubernetes.max_cpu_per_pod")


def _per_pod_cap(judge: _Judge, asked: list[tuple[FieldPath, str | None]], cap: str | None, rule: str) -> None:
    """Each quantity a pod asks for against the policy's cap (compared as exact values: 1000m is 1)."""
    from trainpipe.quantities import quantity_value

    if cap is None:
        return
    for path, value in asked:
        if value is not None and quantity_value(value) > quantity_value(cap):
            judge.refuse(path, rule, value, f"at most {cap}")


def _affinity(judge: _Judge, at: FieldPath, affinity: Any, rules: Any) -> None:
    """Node affinity selects nodes as a node selector does: judged by the same node label patterns."""
    for kind in ("required", "preferred"):
        for index, requirement in enumerate(getattr(affinity, kind)):
            path = (*at, "affinity", kind, index)
            if requirement.operator == "In":
                for value in requirement.values:
                    judge.names(path, "kubernetes.node_labels", f"{requirement.key}={value}", rules.node_labels,
                                glob=True)
            elif requirement.operator in ("Exists", "Gt", "Lt"):
                # Any value of the key (or a range of them): allowed only where every value is.
                judge.names(path, "kubernetes.node_labels", f"{requirement.key}=*", rules.node_labels, glob=True)


def _placement(judge: _Judge, at: FieldPath, node_selector: dict[str, str], tolerations: list[Any],
               rules: Any) -> None:
    """Node labels and taints the pods may use, wherever the spec places them."""
    for key, value in node_selector.items():
        judge.names((*at, "node_selector", key), "kubernetes.node_labels", f"{key}={value}", rules.node_labels,
                    glob=True)
    for index, toleration in enumerate(tolerations):
        judge.names((*at, "tolerations", index), "kubernetes.tolerations", toleration.key or "*", rules.tolerations,
                    glob=True)


def _allowed_uri(judge: _Judge, at: FieldPath, uri: str, rules: TeamPolicy, storage_root: str) -> None:
    """A storage URI the team reads (data.uri, training.model.pretrained) inside its data.uris."""
    if rules.data.uris is not None and not globs.uri_allowed(uri, rules.data.uris, storage_root):
        resolved = globs.canonical_uri(uri, storage_root) or uri
        judge.refuse(at, "data.uris", uri, f"{', '.join(map(repr, rules.data.uris)) or 'nothing'} (resolved: "
                     f"{resolved!r} against the storage root)")


def _data(judge: _Judge, spec: PipelineSpec, rules: TeamPolicy, storage_root: str) -> None:
    data = spec.data
    _allowed_uri(judge, ("data", "uri"), data.uri, rules, storage_root)
    conn_ids = rules.data.conn_ids
    if conn_ids is None:
        return
    if data.conn_id is not None:
        judge.names(("data", "conn_id"), "data.conn_ids", data.conn_id, conn_ids)
    else:
        _own_credentials(judge, ("data", "conn_id"), data.uri, rules, storage_root)


def _own_credentials(judge: _Judge, at: FieldPath, uri: str, rules: TeamPolicy, storage_root: str) -> None:
    """Under data.conn_ids, an object store read with no connection uses the worker's own credentials (its role,
    its environment): the platform's, not the team's. A relative URI is read through the storage root's."""
    conn_ids = rules.data.conn_ids
    if conn_ids is None:
        return
    if uris.is_absolute(uri) and not (globs.canonical_uri(uri, storage_root) or "").startswith("file://"):
        judge.refuse(at, "data.conn_ids", "the worker's own credentials (no conn_id)",
                     f"a conn_id of {', '.join(map(repr, conn_ids)) or 'nothing'}")


def _notify(judge: _Judge, spec: PipelineSpec, rules: TeamPolicy) -> None:
    notify = spec.notify
    if notify is None:
        return
    allowed = rules.notify
    if notify.email is not None:
        email = notify.email
        judge.names(("notify", "email", "conn_id"), "notify.conn_ids", email.conn_id, allowed.conn_ids)
        if allowed.email_domains is not None:
            addresses = [(("notify", "email", "to", index), address) for index, address in enumerate(email.to)]
            if email.from_email is not None:
                addresses.append((("notify", "email", "from_email"), email.from_email))
            for path, address in addresses:
                domain = address.rpartition("@")[2].strip().lower().rstrip(">")
                if "@" not in address or not globs.matches_any(domain, [d.lower() for d in allowed.email_domains]):
                    judge.refuse(path, "notify.email_domains", address,
                                 f"addresses at {', '.join(map(repr, allowed.email_domains)) or 'nothing'}")
        if (email.from_email is not None and allowed.from_addresses is not None
                and not globs.matches_any(email.from_email.lower(), [a.lower() for a in allowed.from_addresses])):
            judge.refuse(("notify", "email", "from_email"), "notify.from_addresses", email.from_email,
                         f"senders {', '.join(map(repr, allowed.from_addresses)) or 'none'} (or leave from_email out "
                         "for the SMTP connection's own sender)")
    if notify.slack is not None:
        judge.names(("notify", "slack", "conn_id"), "notify.conn_ids", notify.slack.conn_id, allowed.conn_ids)
        judge.names(("notify", "slack", "channel"), "notify.slack_channels", notify.slack.channel,
                    allowed.slack_channels)


def _limits(judge: _Judge, spec: PipelineSpec, rules: TeamPolicy) -> None:
    limits = rules.limits
    training = spec.training
    judge.at_most(("retries",), "limits.max_retries", spec.retries, limits.max_retries)
    if training.kubernetes is not None:
        # A multi-node Job's pod restarts are retries of the training inside one task try.
        judge.at_most(("training", "kubernetes", "max_pod_restarts"), "limits.max_retries",
                      training.kubernetes.max_pod_restarts, limits.max_retries)
    # Relaunches after a preemption, and for an elastic Job part of torchrun's --max_restarts, which restarts
    # after any worker failure: a crashing trainer would loop on the GPUs that many times.
    judge.at_most(("training", "preemption", "max_restarts"), "limits.max_retries", training.preemption.max_restarts,
                  limits.max_retries)
    judge.at_most(("training", "epochs"), "limits.max_epochs", training.epochs, limits.max_epochs)
    judge.at_most(("training", "distributed", "nproc_per_node"), "limits.max_nproc_per_node",
                  training.distributed.nproc_per_node, limits.max_nproc_per_node)
    tuning = spec.tuning
    if tuning is not None:
        judge.at_most(("tuning", "n_trials"), "limits.max_trials", tuning.n_trials, limits.max_trials)
        judge.at_most(("tuning", "max_parallel"), "limits.max_parallel_trials", tuning.max_parallel,
                      limits.max_parallel_trials)
        judge.at_most(("tuning", "trial_epochs"), "limits.max_epochs", tuning.trial_epochs, limits.max_epochs)
    if limits.max_epochs is not None and "epochs" in spec.params:
        # A run parameter may raise epochs per run: its maximum is what a trigger can ask for.
        highs = [b for b in param_bounds("epochs", spec.params["epochs"]) if b.keyword.endswith("aximum")]
        if not highs or highs[0].value > limits.max_epochs:
            # Only the field's own bound (training.epochs) is no maximum the spec declared.
            declared = highs and highs[0].source.startswith("params.")
            judge.refuse(("params", "epochs"), "limits.max_epochs", highs[0].value if declared else "no maximum",
                         f"a maximum of at most {limits.max_epochs} (set params.epochs.maximum)")
    if (spec.priority is not None and limits.max_priority is not None
            and PRIORITY_WEIGHTS[spec.priority] > PRIORITY_WEIGHTS[limits.max_priority]):
        judge.refuse(("priority",), "limits.max_priority", spec.priority, f"at most {limits.max_priority!r}")
    deadline = spec.notify.deadline if spec.notify is not None else None
    if limits.max_deadline_within is not None and deadline is not None and deadline.within > limits.max_deadline_within:
        judge.refuse(("notify", "deadline", "within"), "limits.max_deadline_within", _human(deadline.within),
                     f"at most {_human(limits.max_deadline_within)}")
    cache = training.cache
    # A default above the cap is lowered to it in the plan (team_plan); a written value is the author's choice: refused.
    if (limits.max_cache_age is not None and cache.enabled and cache.max_age > limits.max_cache_age
            and ("training", "cache", "max_age") in judge.loaded.positions):
        judge.refuse(("training", "cache", "max_age"), "limits.max_cache_age", _human(cache.max_age),
                     f"at most {_human(limits.max_cache_age)}")
    if limits.min_schedule_interval is not None and isinstance(spec.schedule, str):
        gap = schedule_min_gap(spec.schedule, limits.min_schedule_interval, spec.start_date)
        if gap is not None and gap < limits.min_schedule_interval:
            judge.refuse(("schedule",), "limits.min_schedule_interval", spec.schedule,
                         f"runs at least {_human(limits.min_schedule_interval)} apart (this one runs "
                         f"{_human(gap)} after the previous run)")


def _human(delta: timedelta) -> str:
    seconds = int(delta.total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def schedule_min_gap(schedule: str, bound: timedelta, start: datetime) -> timedelta | None:
    """The shortest time between two runs of a cron expression or preset (None: runs at most once),
    exact up to ``bound``: a gap at or above it is all the caller needs to know."""
    if schedule.startswith("@"):
        seconds = _PRESET_SECONDS.get(schedule)
        return timedelta(seconds=seconds) if seconds is not None else None
    return _cron_min_gap(schedule, int(bound.total_seconds()), start.astimezone(UTC).replace(tzinfo=None))


@functools.lru_cache(maxsize=1024)
def _cron_min_gap(expression: str, bound: int, start: datetime) -> timedelta:
    from croniter import croniter

    fields = croniter(expression).expanded
    if len(fields) == 5:
        # Times of day alone bound the gap from below: within a day, and from the last run of a day to the
        # first of the next. Most schedules are proven slow enough here, without walking their runs.
        minutes = list(range(60)) if fields[0] == ["*"] else fields[0]
        hours = list(range(24)) if fields[1] == ["*"] else fields[1]
        times = sorted(h * 60 + m for h in hours for m in minutes)
        gaps = [b - a for a, b in pairwise(times)] + [1440 - times[-1] + times[0]]
        if min(gaps) * 60 >= bound:
            return timedelta(seconds=min(gaps) * 60)
    runs = croniter(expression, start)
    previous = runs.get_next(datetime)
    shortest = None
    for _ in range(_CRON_FIRES_CHECKED):
        current = runs.get_next(datetime)
        gap = (current - previous).total_seconds()
        shortest = gap if shortest is None else min(shortest, gap)
        if shortest < bound:
            break
        previous = current
    return timedelta(seconds=shortest if shortest is not None else bound)


def team_plan(policy: Policy, team: str) -> TeamPlan:
    """What the DAG and its run-time checks need of the team (plain data in the plan)."""
    rules = policy.spec.teams[team]
    airflow = rules.airflow
    return TeamPlan(
        name=team,
        pool=airflow.pool,
        execution_timeout=airflow.execution_timeout,
        max_active_runs=airflow.max_active_runs,
        access_control=tuple((role, tuple(perms)) for role, perms in sorted((airflow.access_control or {}).items())),
        data_uris=tuple(rules.data.uris) if rules.data.uris is not None else None,
        max_cache_age=rules.limits.max_cache_age,
        policy_digest=policy.digest,
    )
