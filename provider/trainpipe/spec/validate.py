"""Stage 2 of compilation: loaded YAML -> ``PipelineSpec``, reporting every problem of a file at once.

Pydantic checks each field; the semantic checks below look across fields (a gate on a metric
that evaluation does not compute, a ranking task without a query column, ...). Each problem names
``file:line:col: field.path: message`` and, where one is known, the fix.
"""

from __future__ import annotations

import copy
import difflib
import math
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from trainpipe.errors import SpecError, SpecProblem, shown_value
from trainpipe.spec import expectations as expectation_table
from trainpipe.spec import metric_names as metrics
from trainpipe.spec.environment import env_name_problem, looks_like_credential, reserved_env_reason
from trainpipe.spec.loader import FieldPath, LoadedYaml, load_yaml_file
from trainpipe.spec.pod_keys import key_syntax_problem, label_value_problem, metadata_key_problem
from trainpipe.spec.sections.evaluation import GateSpec, _parse_gate
from trainpipe.spec.sections.kubernetes import NAME_PATTERN_MEANINGS
from trainpipe.spec.sections.params import FAMILY_SETTINGS, OVERRIDABLE_PARAMS
from trainpipe.spec.sections.pipeline import PipelineSpec, bounds_at, overridden_value, param_bounds
from trainpipe.spec.sections.training import (
    CATEGORICAL_ONLY_OPTIONS,
    MAX_HASH_BUCKETS,
    MAX_LAYER_WIDTH,
    MAX_LAYERS,
    NUMERIC_ONLY_OPTIONS,
    TEXT_ONLY_OPTIONS,
    TEXT_OPTIONS,
    ModelParamsError,
    params_problems,
)
from trainpipe.spec.sections.tuning import PRUNER_DEFAULTS, TUNABLE_PARAMS, TuningSpec
from trainpipe.spec.sections.validation import _normalise_expectation
from trainpipe_trainer.config import (
    CHECKPOINT_METRICS,
    EARLY_STOPPING_METRICS,
    MAX_TEXT_HASH_BUCKETS,
    MODEL_TYPE_PATTERN,
    TASK_TYPES,
)


def _fields_by_key(model: type[BaseModel]) -> dict[str, Any]:
    """A model's fields by the key a spec writes (the alias where there is one: ``schema``)."""
    return {field.alias or name: field for name, field in model.model_fields.items()}


def _model_at(path: FieldPath) -> type[BaseModel] | None:
    """The pydantic model that owns the mapping at ``path`` (for "did you mean" on unknown keys)."""
    model: type[BaseModel] | None = PipelineSpec
    keyed = False  # the previous part was a dict of models (tuning.space): this part is a key
    for part in path:
        if model is None or isinstance(part, int) or keyed:
            keyed = False
            continue
        field = _fields_by_key(model).get(part)
        if field is None:
            return None
        annotation = field.annotation
        candidates = [annotation, *getattr(annotation, "__args__", ())]
        model = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
        keyed = getattr(annotation, "__origin__", None) is dict
    return model


def _pydantic_problems(loaded: LoadedYaml, error: ErrorDetails) -> list[SpecProblem]:
    cause = error.get("ctx", {}).get("error")
    if isinstance(cause, ModelParamsError):
        # Each problem of model.params at its own key or item, not all at `params`.
        return [loaded.problem((*error["loc"], *below), message) for below, message in cause.problems]
    return [_pydantic_problem(loaded, error)]


def _pydantic_problem(loaded: LoadedYaml, error: ErrorDetails) -> SpecProblem:
    path: FieldPath = tuple(error["loc"])
    kind = error["type"]
    if kind == "extra_forbidden":
        model = _model_at(path[:-1])
        valid = list(_fields_by_key(model)) if model else []
        close = difflib.get_close_matches(str(path[-1]), valid, n=1, cutoff=0.5)
        hint = f"did you mean `{close[0]}`?" if close else f"valid keys: {', '.join(valid)}"
        return loaded.problem(path, f"unknown key; {hint}")
    if kind == "missing":
        return loaded.problem(path, "required field is missing; add it")
    pattern = str(error.get("ctx", {}).get("pattern", "")) if kind == "string_pattern_mismatch" else ""
    if pattern.startswith("^[A-Za-z]"):
        return loaded.problem(path, "must start with a letter and use only ASCII letters, digits, '_' and '-', "
                                    f"got {error['input']!r}")
    if pattern == MODEL_TYPE_PATTERN:
        return loaded.problem(path, (
            f"{shown_value(error['input'])} is not a model family name (a lowercase letter, then lowercase letters, "
            "digits or _, at most 64): name a family that is built in or that an installed package registers in the "
            "'trainpipe.models' entry-point group, never a module or a path"))
    if pattern in NAME_PATTERN_MEANINGS:
        return loaded.problem(path, f"{shown_value(error['input'])} is not {NAME_PATTERN_MEANINGS[pattern]}; rename it")
    message = error["msg"]
    if message.startswith("Value error, "):
        message = message[len("Value error, "):]
    if kind not in {"value_error", "assertion_error"} and "input" in error and not isinstance(error["input"], dict | list):
        message += f", got {shown_value(error['input'])}"
    if kind == "string_too_long":
        message += "; shorten it"
    return loaded.problem(path, message)


def _expectation_problems(loaded: LoadedYaml, index: int, item: Any) -> list[SpecProblem]:
    """One ``validation.expectations`` item: its name, then its arguments (unknown, missing, wrong
    type) against Great Expectations' own models, read from the table ``spec.expectations`` keeps
    (importing GE costs seconds, too much for DAG parsing)."""
    here: FieldPath = ("validation", "expectations", index)
    normalised = _normalise_expectation(item)
    name = normalised.get("name") if isinstance(normalised, dict) else None
    if not isinstance(name, str):
        return []  # pydantic reports the unreadable item
    if name not in expectation_table.known_names():
        close = difflib.get_close_matches(name, sorted(expectation_table.known_names()), n=1, cutoff=0.6)
        fix = f"did you mean `{close[0]}`?" if close else "see https://greatexpectations.io/expectations/"
        return [loaded.problem(here, f"unknown Great Expectations expectation {name!r}; {fix}")]
    kwargs = normalised.get("kwargs", {})
    if not isinstance(kwargs, dict):
        return []  # pydantic reports it
    # The arguments sit under the name ({expect_x: {column: a}}) or under kwargs ({name: expect_x, kwargs: ...}).
    at = (*here, "kwargs") if isinstance(item, dict) and "name" in item else (*here, name)
    arguments, missing = expectation_table.argument_problems(name, kwargs)
    unsafe, refused = expectation_table.evaluated_text_problems(name, kwargs)
    arguments, missing = [*arguments, *unsafe], [*refused, *missing]
    return [*(loaded.problem(here, message) for message in missing),
            *(loaded.problem((*at, *path), message) for path, message in arguments)]


def _get(data: Any, *path: str | int) -> Any:
    """Raw value at ``path`` or None: the checks below also run on specs that failed pydantic."""
    for part in path:
        if isinstance(part, int):
            if not isinstance(data, list) or part >= len(data):
                return None
        elif not isinstance(data, dict):
            return None
        data = data[part] if isinstance(part, int) else data.get(part)
    return data


# The mlp family's settings, written as the spec's own keys before families existed (tuning and run parameters
# reach the same two).
_MLP_SETTINGS = ("hidden_layers", "dropout")


def _model_family_problems(loaded: LoadedYaml) -> list[SpecProblem]:
    """model.params belongs to a family that takes parameters; hidden_layers and dropout to the mlp alone."""
    model = _get(loaded.data, "training", "model")
    family = model.get("type", "mlp") if isinstance(model, dict) else "mlp"
    if not isinstance(family, str):
        return []  # pydantic reports it
    problems: list[SpecProblem] = _family_setting_problems(loaded, family, model)
    if family != "transformer" and isinstance(model, dict) and model.get("pretrained") is not None:
        problems.append(loaded.problem(("training", "model", "pretrained"), (
            f"pretrained weights are read by the transformer family only, and training.model.type is {family!r}; "
            "remove pretrained, or set training.model.type: transformer")))
    if family == "mlp":
        if isinstance(model, dict) and model.get("params"):
            problems.append(loaded.problem(("training", "model", "params"), (
                "the mlp family takes no params: its settings are training.model.hidden_layers and dropout; remove "
                "params, or name the family that takes them in training.model.type")))
        return problems
    # Another family never reads them: a value written there would look set and change nothing.
    for path in (*(("training", "model", name) for name in _MLP_SETTINGS),
                 *(("params", name) for name in _MLP_SETTINGS), *(("tuning", "space", name) for name in _MLP_SETTINGS)):
        if _get(loaded.data, *path) is not None:
            problems.append(loaded.problem(path, (
                f"{path[-1]} is a setting of the mlp family, and training.model.type is {family!r}; put the family's "
                "own settings in training.model.params (tuning.space reaches the transformer's "
                f"{' and '.join(FAMILY_SETTINGS)}; a run parameter cannot reach them yet)")))
    params = model.get("params", {}) if isinstance(model, dict) else {}
    if family in _BUILT_IN_PARAMS_CHECKS and isinstance(params, dict) and not params_problems(params):
        problems.extend(_built_in_params_problems(loaded, family, params))
    if family == "transformer":
        if not isinstance(model, dict) or model.get("pretrained") is None:
            problems.append(loaded.problem(("training", "model"), (
                "the transformer family starts from pretrained weights: add training.model.pretrained, a "
                "save_pretrained folder (a path relative to the storage root or an s3:// URI; hf://owner/name where "
                "the platform policy sets models.hub: true)")))
        problems.extend(_transformer_input_problems(loaded))
    return problems


def _family_setting_problems(loaded: LoadedYaml, family: str, model: Any) -> list[SpecProblem]:
    """A family's own tuned names (``FAMILY_SETTINGS``: max_length, lora_r) in tuning.space only under that
    family, and only with the params they need (lora_r: trainable: lora)."""
    params = model.get("params") if isinstance(model, dict) else None
    params = params if isinstance(params, dict) else {}
    problems: list[SpecProblem] = []
    space = _get(loaded.data, "tuning", "space")
    for name in space if isinstance(space, dict) else {}:
        if name not in FAMILY_SETTINGS:
            continue
        owner, needs = FAMILY_SETTINGS[name]
        path = ".".join(TUNABLE_PARAMS[name][0])
        if family != owner:
            problems.append(loaded.problem(("tuning", "space", name), (
                f"{name} tunes {path}, a parameter of the {owner} family, and training.model.type is {family!r}; "
                f"remove it from tuning.space, or set training.model.type: {owner}")))
            continue
        for key, value in needs.items():
            if params.get(key) != value:
                problems.append(loaded.problem(("tuning", "space", name), (
                    f"{name} tunes {path}, which the {owner} family reads only with {key}: {value}, and "
                    + (f"training.model.params.{key} is {shown_value(params[key])}" if key in params else
                       f"training.model.params leaves {key} out") + "; set "
                    f"training.model.params.{key}: {value}, or remove {name} from tuning.space")))
    return problems


# The families built in whose params spec validation checks, torch-free, with the family's own check:
# family -> (module, function) of trainpipe_trainer.
_BUILT_IN_PARAMS_CHECKS = {
    "text_bag": ("trainpipe_trainer.models.text_bag.params", "validate_text_bag_params"),
    "transformer": ("trainpipe_trainer.models.transformer.params", "validate_transformer_params"),
}
# The tasks the transformer family trains, and how many text features each reads.
_TRANSFORMER_TEXTS = {"binary_classification": (1, 2), "multiclass_classification": (1, 2), "regression": (1, 2),
                      "causal_lm": (1, 1)}


def _transformer_input_problems(loaded: LoadedYaml) -> list[SpecProblem]:
    """The transformer reads text only, through its pretrained tokenizer: every feature declared ``type: text``,
    one or two of them (exactly one for causal_lm), and a task it trains."""
    problems: list[SpecProblem] = []
    task = _get(loaded.data, "training", "task")
    if task in TASK_TYPES and task not in _TRANSFORMER_TEXTS:
        problems.append(loaded.problem(("training", "task"), (
            f"the transformer family does not train {task!r}; it trains {', '.join(_TRANSFORMER_TEXTS)}: set one of "
            "those, or another training.model.type")))
        return problems
    features = _get(loaded.data, "training", "features")
    transforms = _get(loaded.data, "training", "transforms")
    transforms = transforms if isinstance(transforms, dict) else {}
    if not isinstance(features, list):
        return problems  # pydantic reports it
    for index, name in enumerate(features):
        if not isinstance(name, str):
            continue
        declared = transforms.get(name)
        kind = declared.get("type") if isinstance(declared, dict) else None
        if kind == "text":
            continue
        fix = (f"declare it text (training.transforms: {{{name}: {{type: text}}}}), or drop the feature; numeric "
               "and categorical columns need another family (text_bag reads both)")
        if isinstance(declared, dict) and "type" in declared:
            problems.append(loaded.problem(("training", "transforms", name, "type"), (
                f"{name!r} is {shown_value(kind)}, and the transformer family reads text columns only; {fix}")))
        else:
            problems.append(loaded.problem(("training", "features", index), (
                f"{name!r} is not declared text, and the transformer family reads text columns only; {fix}")))
    low, high = _TRANSFORMER_TEXTS.get(task, (1, 2))
    count = len([name for name in features if isinstance(name, str)])
    if not problems and not low <= count <= high:
        wanted = "exactly one text feature (the prompt or the text to learn)" if task == "causal_lm" else \
            "one or two text features (a text, or a pair such as question and passage)"
        problems.append(loaded.problem(("training", "features"), (
            f"{count} features, and the transformer family reads {wanted} for {task}; "
            + ("put the completion in training.label" if task == "causal_lm" else "keep one or two")
            + " or join texts into one column before training")))
    return problems


def _built_in_params_problems(loaded: LoadedYaml, family: str, params: dict[str, Any]) -> list[SpecProblem]:
    """A built-in family's params are checked here, torch-free, by the family's own check (the train step
    checks them again before launch); only params that are bounded JSON data, pydantic reports the rest."""
    import importlib

    from trainpipe_trainer.models.family import FamilyParamsError

    module, function = _BUILT_IN_PARAMS_CHECKS[family]
    try:
        getattr(importlib.import_module(module), function)(params)
    except FamilyParamsError as err:
        below = tuple(int(part) if part.isdigit() else part for part in err.path.split(".")) if err.path else ()
        prefix = f"model.params.{err.path}: " if err.path else "model.params: "
        return [loaded.problem(("training", "model", "params", *below), str(err).removeprefix(prefix))]
    return []


def _semantic_problems(loaded: LoadedYaml) -> list[SpecProblem]:
    """Checks across fields, on the raw data, so a file's problems are all reported in one pass."""
    problems: list[SpecProblem] = []
    data = loaded.data
    add = lambda path, message: problems.append(loaded.problem(path, message))  # noqa: E731

    if _get(data, "data", "window") is not None and not _get(data, "data", "time_column"):
        add(("data", "window"), "window needs data.time_column: name the timestamp column to cut the window on")
    if _get(data, "data", "snapshot") == "manifest":
        # A manifest versions whole files: it cannot cut rows out of them, and a csv has no row groups.
        fix = ("a manifest versions whole files: point data.uri at the window's own folder or prefix, or use "
               "data.snapshot: copy")
        for field in ("window", "time_column"):
            if _get(data, "data", field) is not None:
                add(("data", "snapshot"), f"manifest does not take data.{field}; {fix}")
        uri, file_format = _get(data, "data", "uri"), _get(data, "data", "format")
        if file_format == "csv" or (file_format is None and isinstance(uri, str)
                                    and uri.lower().rstrip("/").endswith(".csv")):
            add(("data", "snapshot"), "manifest reads parquet files only, and data.format is csv; convert the "
                                      "files to parquet or use data.snapshot: copy")
        if _get(data, "training", "task") == "ranking":
            # Its holdout is whole row groups: a query spread over two would be trained on and judged on.
            add(("data", "snapshot"), "manifest splits the holdout by row group, which would cut queries in two; "
                                      "ranking takes data.snapshot: copy (its holdout is by query id)")

    task = _get(data, "training", "task")
    features = _get(data, "training", "features")
    label = _get(data, "training", "label")
    if isinstance(features, list):
        seen: set[Any] = set()
        for index, feature in enumerate(features):
            if not isinstance(feature, str):
                continue  # pydantic reports the wrong type itself
            if feature == label:
                add(("training", "features", index), f"{feature!r} is the label; remove it from features")
            elif feature in seen:
                add(("training", "features", index), f"{feature!r} is listed twice; remove one")
            seen.add(feature)
    problems.extend(_transform_problems(loaded, features, label))
    group_column = _get(data, "training", "group_column")
    if task == "ranking" and not group_column:
        add(("training", "group_column") if "training" in data else ("training",),
            "task 'ranking' needs group_column, the query id column")
    if task in TASK_TYPES and task != "ranking" and group_column:
        add(("training", "group_column"), f"group_column only applies to task 'ranking', not {task!r}; remove it")
    problems.extend(_label_class_problems(loaded, task))
    problems.extend(_model_family_problems(loaded))
    training = _get(data, "training")
    if task in TASK_TYPES and task != "causal_lm" and isinstance(training, dict) and "label" not in training:
        add(("training", "label"), "required field is missing; add it")
    family = _get(data, "training", "model", "type")
    if task == "causal_lm" and (family or "mlp") != "transformer" and isinstance(family, str | None):
        add(("training", "task"), (
            f"causal_lm (a language model's next tokens) trains with the transformer family only, and "
            f"training.model.type is {family or 'mlp'!r}{'' if family else ' (the default)'}: set "
            "training.model.type: transformer with training.model.pretrained"))
    stopping_metric = _get(data, "training", "early_stopping", "metric")
    if task in TASK_TYPES and isinstance(stopping_metric, str) and stopping_metric not in CHECKPOINT_METRICS[task] \
            and stopping_metric in EARLY_STOPPING_METRICS:
        add(("training", "early_stopping", "metric"),
            f"a {task} trainer does not compute {stopping_metric}; use one of {', '.join(CHECKPOINT_METRICS[task])}")

    expectations = _get(data, "validation", "expectations")
    for index, item in enumerate(expectations if isinstance(expectations, list) else []):
        problems.extend(_expectation_problems(loaded, index, item))

    problems.extend(_drift_problems(loaded, features if isinstance(features, list) else None))

    metric_names = _get(data, "evaluation", "metrics")
    known_task = task in TASK_TYPES
    if isinstance(metric_names, list) and known_task:
        for index, name in enumerate(metric_names):
            if isinstance(name, str) and not metrics.is_known_metric(task, name):
                hint = metrics.suggest_metric(task, name)
                fix = f"did you mean `{hint}`?" if hint else f"use one of {', '.join(metrics.metric_names(task))}"
                add(("evaluation", "metrics", index), f"{name!r} is not a {task} metric; {fix}")
    gates = _get(data, "evaluation", "gates")
    for index, raw_gate in enumerate(gates if isinstance(gates, list) else []):
        try:
            gate = GateSpec.model_validate(_parse_gate(raw_gate))
        except (ValueError, ValidationError):
            continue  # pydantic reports the unreadable gate itself
        if isinstance(metric_names, list) and gate.metric not in metric_names:
            add(("evaluation", "gates", index), _gate_metric_problem(str(gate), gate.metric, metric_names,
                                                                     task if known_task else None))
        if gate.baseline and task == "causal_lm":
            add(("evaluation", "gates", index), (
                f"gate '{gate}' compares with the baseline model, and a causal_lm evaluation has none (no linear "
                f"model predicts tokens); compare with the champion (a relative gate such as '{gate.metric} >= -1%': at "
                "most 1% worse) or with a number"))
        if gate.worst_slice and not _get(data, "evaluation", "slices"):
            add(("evaluation", "gates", index),
                f"gate '{gate}' is on the worst slice, but evaluation.slices names no column; add e.g. "
                f"`slices: [region]` to evaluation, or gate the whole holdout with '{gate.metric} ...'")
    problems.extend(_slice_problems(loaded, label=label, group_column=group_column, task=task))

    problems.extend(_alias_problems(loaded))

    params = _get(data, "params")
    for name in params if isinstance(params, dict) else {}:
        if name not in OVERRIDABLE_PARAMS:
            close = difflib.get_close_matches(str(name), sorted(OVERRIDABLE_PARAMS), n=1, cutoff=0.5)
            fix = f"did you mean `{close[0]}`?" if close else f"use one of {', '.join(sorted(OVERRIDABLE_PARAMS))}"
            add(("params", name), f"{name!r} is not a hyperparameter a run can override; {fix}")
    space = _get(data, "tuning", "space")
    for name in space if isinstance(space, dict) else {}:
        if name not in TUNABLE_PARAMS:
            close = difflib.get_close_matches(str(name), sorted(TUNABLE_PARAMS), n=1, cutoff=0.5)
            fix = f"did you mean `{close[0]}`?" if close else f"use one of {', '.join(sorted(TUNABLE_PARAMS))}"
            add(("tuning", "space", name), f"{name!r} is not a hyperparameter a trial can tune; {fix}")
    problems.extend(_launcher_problems(loaded))
    problems.extend(_asset_schedule_problems(loaded))
    approval = _get(data, "registration", "approval")
    if isinstance(approval, dict) and approval.get("mode") == "none":
        for key in ("timeout", "on_timeout"):
            if key in approval:
                add(("registration", "approval", key), f"{key} applies only with mode: required; remove it or set "
                    "mode: required")
    if isinstance(_get(data, "notify", "slack"), dict) and not _installed(SLACK_PROVIDER):
        add(("notify", "slack"), f"needs Airflow's Slack provider, which is not installed here: pip install "
            f"{SLACK_PROVIDER} (on the scheduler and workers), or remove notify.slack")
    if isinstance(_get(data, "notify", "deadline"), dict) and (found := airflow_without_deadlines()) is not None:
        add(("notify", "deadline"), f"needs Airflow's Deadline Alerts (Airflow {DEADLINE_AIRFLOW[0]}."
            f"{DEADLINE_AIRFLOW[1]} or later), and the Airflow here is {found}; upgrade Airflow or remove "
            "notify.deadline")
    return problems


def _label_class_problems(loaded: LoadedYaml, task: Any) -> list[SpecProblem]:
    """``training.label_classes``: multiclass only, and each class once (as text: ``2`` and ``"2"`` are one)."""
    classes = _get(loaded.data, "training", "label_classes")
    if classes is None:
        return []
    path = ("training", "label_classes")
    if task in TASK_TYPES and task != "multiclass_classification":
        return [loaded.problem(path, f"label_classes only applies to task 'multiclass_classification', not "
                                     f"{task!r}; remove it")]
    problems = []
    seen: set[str] = set()
    for index, value in enumerate(classes if isinstance(classes, list) else []):
        if isinstance(value, bool) or not isinstance(value, str | int):
            continue  # pydantic reports the wrong type itself
        if str(value) in seen:
            problems.append(loaded.problem((*path, index), f"class {shown_value(str(value))} is listed twice "
                                                           "(classes are compared as text); remove one"))
        seen.add(str(value))
    return problems


def _asset_schedule_problems(loaded: LoadedYaml) -> list[SpecProblem]:
    """schedule.assets: no userinfo, which Airflow drops with a warning (the DAG would wait for another asset than
    the one written). Airflow's own Asset rules (the reserved airflow scheme, a bucket for s3, ...) are applied
    when the DAG is built, located at the item (``dags.builder``): this stage imports no Airflow."""
    from trainpipe.uris import userinfo_problem

    assets = _get(loaded.data, "schedule", "assets")
    problems: list[SpecProblem] = []
    for index, uri in enumerate(assets if isinstance(assets, list) else []):
        if isinstance(uri, str) and (problem := userinfo_problem(uri)) is not None:
            problems.append(loaded.problem(("schedule", "assets", index), problem))
    return problems


def _gate_metric_problem(gate: str, metric: str, computed: list[Any], task: str | None) -> str:
    """A gate on a metric evaluation does not compute: the metric meant (case, a near miss), or the fix."""
    names = [name for name in computed if isinstance(name, str)]
    same_but_case = [name for name in names if name.lower() == metric.lower()]
    close = same_but_case or difflib.get_close_matches(metric.lower(), names, n=1, cutoff=0.6)
    where = f"gate '{gate}' uses {metric!r}, which evaluation does not compute"
    if close:
        return f"{where}; did you mean `{close[0]}`?"
    if task is not None and not metrics.is_known_metric(task, metric):
        hint = metrics.suggest_metric(task, metric.lower())
        return f"{where}, nor is it a {task} metric; " + (
            f"did you mean `{hint}`?" if hint else f"use one of {', '.join(metrics.metric_names(task))}")
    return f"{where}; add it to evaluation.metrics"


def _drift_problems(loaded: LoadedYaml, features: list[Any] | None) -> list[SpecProblem]:
    """validation.drift: per-feature entries name features, and a warn level is not above its fail level."""
    problems: list[SpecProblem] = []
    drift = _get(loaded.data, "validation", "drift")
    if not isinstance(drift, dict):
        return problems
    here: FieldPath = ("validation", "drift")

    def check_levels(path: FieldPath, levels: Any) -> None:
        if not isinstance(levels, dict):
            return
        warn, fail = _number(levels.get("warn")), _number(levels.get("fail"))
        if warn is not None and fail is not None and warn > fail:
            problems.append(loaded.problem((*path, "warn"),
                f"warn level {warn:g} is above the fail level {fail:g}; a warning must come first: lower warn or raise fail"))

    for statistic in ("psi", "ks"):
        check_levels((*here, statistic), drift.get(statistic))
    per_feature = drift.get("features")
    for name, entry in per_feature.items() if isinstance(per_feature, dict) else ():
        if features is not None and name not in features:
            close = difflib.get_close_matches(str(name), [str(f) for f in features], n=1, cutoff=0.5)
            fix = f"did you mean `{close[0]}`?" if close else f"training.features are {', '.join(map(str, features))}"
            problems.append(loaded.problem((*here, "features", name), f"{name!r} is not a feature; {fix}"))
        if isinstance(entry, dict):
            for statistic in ("psi", "ks"):
                check_levels((*here, "features", name, statistic), entry.get(statistic))
    return problems


SLACK_PROVIDER = "apache-airflow-providers-slack"


# DeadlineAlert with notifier callbacks (AsyncCallback, run by the triggerer) came with Airflow 3.1.
DEADLINE_AIRFLOW = (3, 1)


def airflow_without_deadlines(version: str | None = None) -> str | None:
    """The installed Airflow's version when it has no Deadline Alerts (``DEADLINE_AIRFLOW``), else None; read from
    the package metadata, as ``_installed`` does."""
    import re
    from importlib import metadata

    if version is None:
        try:
            version = metadata.version("apache-airflow")
        except metadata.PackageNotFoundError:
            return "not installed"
    numbers = tuple(int(n) for n in re.findall(r"\d+", version)[:2])
    return None if numbers >= DEADLINE_AIRFLOW else version



def _number(value: Any) -> float | None:
    """``value`` if it is a number (YAML's true and false are not), else None."""
    return None if isinstance(value, bool) or not isinstance(value, int | float) else value

def _installed(distribution: str) -> bool:
    """By the package metadata: importing the provider would import Airflow, which the spec stage never does."""
    from importlib import metadata

    try:
        metadata.distribution(distribution)
    except metadata.PackageNotFoundError:
        return False
    return True


def _transform_problems(loaded: LoadedYaml, features: Any, label: Any) -> list[SpecProblem]:
    """``training.transforms``: each names a listed feature, and its options fit its type."""
    problems: list[SpecProblem] = []
    transforms = _get(loaded.data, "training", "transforms")
    if not isinstance(transforms, dict):
        return problems
    listed = [f for f in features if isinstance(f, str)] if isinstance(features, list) else []
    for name, options in transforms.items():
        here = ("training", "transforms", name)
        add = lambda path, message: problems.append(loaded.problem(path, message))  # noqa: E731
        if name == label:
            add(here, f"{name!r} is the label; transforms apply to features")
        elif isinstance(features, list) and name not in listed:
            close = difflib.get_close_matches(str(name), listed, n=1, cutoff=0.6)
            fix = f"did you mean `{close[0]}`?" if close else "add it to training.features or remove this transform"
            add(here, f"{name!r} is not in training.features; {fix}")
        if not isinstance(options, dict):
            continue  # pydantic reports it
        declared = options.get("type")
        if declared == "text":
            problems.extend(_text_transform_problems(loaded, here, name, options))
            continue
        # Text is never inferred: its own options on another type are refused, not taken as a declaration.
        for key in TEXT_ONLY_OPTIONS:
            if key in options:
                add((*here, key), f"{key} applies to text features; set type: text or remove it")
        categorical = declared == "categorical" or (declared is None and any(k in options for k in CATEGORICAL_ONLY_OPTIONS))
        if declared == "numeric":
            for key in CATEGORICAL_ONLY_OPTIONS:
                if key in options:
                    add((*here, key), f"{key} applies to categorical features; set type: categorical or remove it")
        if categorical:
            for key in NUMERIC_ONLY_OPTIONS:
                if key in options:
                    add((*here, key), f"{key} applies to numeric features, and {name!r} is categorical (a missing "
                                      "category is the category '<missing>'); remove it")
            encode = options.get("encode", "one_hot")
            if encode == "hashing" and "max_categories" in options:
                add((*here, "max_categories"), "max_categories applies to encode: one_hot; with hashing set hash_buckets")
            if encode == "one_hot" and "hash_buckets" in options:
                add((*here, "hash_buckets"), "hash_buckets applies to encode: hashing; with one_hot set max_categories")
            continue
        impute = options.get("impute")
        if impute == "constant" and options.get("fill_value") is None:
            add((*here, "impute"), "impute: constant needs the value: add fill_value (e.g. fill_value: 0)")
        if "fill_value" in options and impute != "constant":
            add((*here, "fill_value"), "fill_value is used by impute: constant only; set impute: constant or remove it")
        if options.get("missing_indicator") is True and impute is None:
            add((*here, "missing_indicator"),
                "missing_indicator marks imputed rows: add impute (mean, median or constant)")
        clip = options.get("clip")
        low, high = (clip.get("min"), clip.get("max")) if isinstance(clip, dict) else \
            (clip if isinstance(clip, list) and len(clip) == 2 else (None, None))
        if isinstance(low, int | float) and isinstance(high, int | float) and low > high:
            add((*here, "clip"), f"min {low:g} is above max {high:g}; swap them")
    return problems


def _text_transform_problems(loaded: LoadedYaml, here: FieldPath, name: Any, options: dict[str, Any]) -> list[SpecProblem]:
    """A ``type: text`` transform: text's options only, ids exact in float32, and a family that reads them."""
    problems = []
    for key in (*NUMERIC_ONLY_OPTIONS, *CATEGORICAL_ONLY_OPTIONS):
        if key in options and key not in TEXT_OPTIONS:
            kind = "numeric" if key in NUMERIC_ONLY_OPTIONS else "categorical"
            problems.append(loaded.problem((*here, key), (
                f"{key} applies to {kind} features, and {name!r} is text (its words become hashed token ids; a "
                f"missing text has none); remove it, or set type: {kind}")))
    buckets = _number(options.get("hash_buckets"))
    # Above MAX_HASH_BUCKETS pydantic refuses it already, at the same line.
    if buckets is not None and MAX_TEXT_HASH_BUCKETS < buckets <= MAX_HASH_BUCKETS:
        problems.append(loaded.problem((*here, "hash_buckets"), (
            f"at most {MAX_TEXT_HASH_BUCKETS:,} for text (token ids travel as float32, exact below 2^24), got "
            f"{shown_value(buckets)}; lower it")))
    family = _get(loaded.data, "training", "model", "type")
    family = "mlp" if family is None else family
    if family == "transformer":
        # Hashed token ids are text_bag's; the transformer tokenises with its pretrained tokenizer.
        for key in TEXT_OPTIONS:
            if key in options:
                problems.append(loaded.problem((*here, key), (
                    f"{key} sets the hashed token ids of families such as text_bag, and the transformer family "
                    "tokenises text with its pretrained tokenizer; remove it (a text's length in tokens is "
                    "training.model.params.max_length)")))
    if family == "mlp":
        # The mlp takes one number per input; a token id is a hash, not a quantity.
        problems.append(loaded.problem((*here, "type"), (
            f"{name!r} is text, whose token ids the mlp family (training.model.type, by default mlp) does not read; "
            "set training.model.type: text_bag (or a family that reads token ids), or drop the feature")))
    return problems


_ALIAS_DEFAULTS = {"alias": "champion", "challenger_alias": "challenger", "previous_alias": "previous_champion"}


def _alias_problems(loaded: LoadedYaml) -> list[SpecProblem]:
    """The production, challenger and previous aliases name three different roles."""
    registration = _get(loaded.data, "registration")
    if not isinstance(registration, dict):
        return []
    values = {key: registration.get(key, default) for key, default in _ALIAS_DEFAULTS.items()}
    problems = []
    keys = list(values)
    for i, key in enumerate(keys):
        for other in keys[i + 1:]:
            # Without case: Unity Catalog, and MLflow on a case-insensitive database collation, take 'Champion'
            # for 'champion', so register would move the production alias before any approval.
            if isinstance(values[key], str) and isinstance(values[other], str) and values[key].lower() == values[other].lower():
                # Located on the key the file sets (a default has no line of its own).
                where = other if other in registration else key
                clash = key if where == other else other
                case = "" if values[where] == values[clash] else f" ({values[clash]!r}: some registries ignore case)"
                problems.append(loaded.problem(("registration", where), (
                    f"{values[where]!r} is also registration.{clash}{case}; the production, challenger and previous "
                    "aliases must differ")))
    problems.extend(_backtest_alias_problems(loaded, registration, values))
    return problems


def _backtest_alias_problems(loaded: LoadedYaml, registration: dict[str, Any],
                             lifecycle: dict[str, Any]) -> list[SpecProblem]:
    """registration.backtest.alias: a name of its own, never one the lifecycle moves (a backtest must not
    look like a production, challenger or previous version, in this spec or by the usual names)."""
    backtest = registration.get("backtest")
    if not isinstance(backtest, dict) or backtest.get("alias") is None:
        return []
    alias = backtest["alias"]
    where = ("registration", "backtest", "alias")
    if not isinstance(alias, str):
        return []  # pydantic reports the wrong type
    if backtest.get("register") is not True:
        return [loaded.problem(where, "an alias applies only with register: true (an unregistered backtest has no "
                               "version to name); set register: true or remove the alias")]
    # Compared without case, as above.
    taken = {**{value.lower(): ("a lifecycle alias", value) for value in _ALIAS_DEFAULTS.values()},
             **{value.lower(): (f"registration.{key}", value) for key, value in lifecycle.items() if isinstance(value, str)}}
    if alias.lower() in taken:
        what, value = taken[alias.lower()]
        case = "" if alias == value else f" ({value!r}: some registries ignore case)"
        return [loaded.problem(where, f"{alias!r} is {what}{case}; a backtest never takes a lifecycle alias, use a "
                               "name of its own such as `backtest`")]
    return []


def _slice_problems(loaded: LoadedYaml, *, label: Any, group_column: Any, task: Any) -> list[SpecProblem]:
    """evaluation.slices: each column once, and not the label (a slice of one class has no auc)."""
    problems: list[SpecProblem] = []
    slices = _get(loaded.data, "evaluation", "slices")
    seen: set[Any] = set()
    for index, column in enumerate(slices if isinstance(slices, list) else []):
        here = ("evaluation", "slices", index)
        if not isinstance(column, str):
            continue  # pydantic reports it
        if not column.strip():
            problems.append(loaded.problem(here, "a slice column name is empty; name a column of the data"))
        elif column == label:
            problems.append(loaded.problem(here, f"{column!r} is the label: its slices would each hold one label value; "
                                                 "slice by another column"))
        elif column in seen:
            problems.append(loaded.problem(here, f"{column!r} is listed twice; remove one"))
        elif task == "ranking" and column == group_column:
            problems.append(loaded.problem(here, f"{column!r} is the query id: every query would be its own slice; "
                                                 "slice by a column that groups queries (market, device, ...)"))
        elif _get(loaded.data, "training", "transforms", column, "type") == "text":
            problems.append(loaded.problem(here, f"{column!r} is text: nearly every row would be its own slice; "
                                                 "slice by a column that groups rows (language, source, ...)"))
        seen.add(column)
    return problems


def _tuning_problems(loaded: LoadedYaml, spec: PipelineSpec) -> list[SpecProblem]:
    """``tuning:`` against the rest: each range within its hyperparameter's own bounds, and a training
    that has evaluation points (checkpoints with a validation loss) for trials to report at."""
    tuning = spec.tuning
    if tuning is None:
        return []
    problems: list[SpecProblem] = []
    add = lambda path, message: problems.append(loaded.problem(path, message))  # noqa: E731
    for name, distribution in tuning.space.items():
        if name not in TUNABLE_PARAMS:
            continue  # reported by _semantic_problems
        path, kind = TUNABLE_PARAMS[name]
        here = ("tuning", "space", name)
        if kind == "layers":
            if distribution.kind != "choice":
                add((*here, distribution.kind), "hidden_layers is tuned with {choice: [[32], [64, 32], ...]}, "
                                                "a list of layer-size lists")
            elif not all(isinstance(c, list) and 0 < len(c) <= MAX_LAYERS
                         and all(isinstance(n, int) and not isinstance(n, bool) and 0 < n <= MAX_LAYER_WIDTH for n in c)
                         for c in distribution.candidates):
                add((*here, "choice"), f"each choice of hidden_layers is a list of 1 to {MAX_LAYERS} layer sizes from "
                                       f"1 to {MAX_LAYER_WIDTH:,}, such as [64, 32]")
            continue
        if kind == "int" and distribution.kind in ("uniform", "log_uniform"):
            add((*here, distribution.kind), f"{name} is a whole number: use {{int: [low, high]}} or {{choice: [...]}}")
            continue
        for value in distribution.candidates:
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or (
                    kind == "int" and value != int(value)):
                add((*here, distribution.kind), f"{value!r} is not a valid {'.'.join(path)}: it must be "
                                                f"{'a whole number' if kind == 'int' else 'a finite number'}")
                break
            if name in FAMILY_SETTINGS:
                refused = _family_value_problem(spec, path, value)
                if refused is not None:
                    add((*here, distribution.kind), f"{value!r} is not a valid {'.'.join(path)}: it must be "
                                                    f"{refused}; narrow the range")
                    break
                continue
            broken = next((b for b in bounds_at(path) if not b.admits(value)), None)
            if broken is not None:
                add((*here, distribution.kind), f"{value!r} is not a valid {'.'.join(path)}: it must be "
                                                f"{broken.describe()}; narrow the range")
                break
    problems.extend(_tuning_metric_problems(loaded, tuning, spec.training.task))
    problems.extend(_pruner_problems(loaded, tuning))
    training = spec.training
    if training.launcher != "local":
        add(("tuning",), "trials run with the local launcher only for now; use training.launcher: local, or "
                         "remove tuning: and search elsewhere")
    checkpoint = training.checkpoint
    if not checkpoint.keep_best or checkpoint.validation_fraction == 0:
        add(("training", "checkpoint"), "tuning needs a validation loss at each checkpoint: keep keep_best true and "
                                        "validation_fraction above 0")
    if checkpoint.every_n_steps is None and checkpoint.every is None:
        add(("training", "checkpoint"), "tuning reports at each checkpoint, so trials need several: set "
                                        "training.checkpoint.every_n_steps (e.g. a tenth of a trial's steps)")
    return problems


def _family_value_problem(spec: PipelineSpec, path: tuple[str, ...], value: Any) -> str | None:
    """Why the family's own check refuses the spec's model.params with ``value`` at ``path`` (under
    training.model.params), or None; a family without a check here (or params it refuses already) is left to
    the train step's check."""
    import importlib

    from trainpipe_trainer.models.family import FamilyParamsError

    model = spec.training.model
    if model.type not in _BUILT_IN_PARAMS_CHECKS or params_problems(model.params):
        return None
    below = path[len(("training", "model", "params")):]
    params = copy.deepcopy(dict(model.params))
    inner = params
    for part in below[:-1]:
        if not isinstance(inner.get(part), dict):
            inner[part] = {}
        inner = inner[part]
    inner[below[-1]] = value
    module, function = _BUILT_IN_PARAMS_CHECKS[model.type]
    try:
        getattr(importlib.import_module(module), function)(params)
    except FamilyParamsError as err:
        if err.path != ".".join(below):
            return None  # another parameter's problem: reported at its own line
        return str(err).removeprefix(f"model.params.{err.path}: ")
    return None


def _tuning_metric_problems(loaded: LoadedYaml, tuning: TuningSpec, task: str) -> list[SpecProblem]:
    """``tuning.metric`` is one the task's trainer computes at its checkpoints; ``direction`` is its own."""
    reported = CHECKPOINT_METRICS[task]
    if tuning.metric not in reported:
        others = [t for t, metrics in CHECKPOINT_METRICS.items() if tuning.metric in metrics]
        if others:
            why = f"{tuning.metric!r} is computed for {', '.join(others)} only"
        else:
            close = difflib.get_close_matches(tuning.metric, list(reported), n=1, cutoff=0.5)
            why = f"unknown metric {tuning.metric!r}" + (f" (did you mean `{close[0]}`?)" if close else "")
        return [loaded.problem(("tuning", "metric"), f"{why}; a {task} trainer reports {', '.join(reported)} at each "
                                                     "checkpoint: tune on one of those")]
    own = reported[tuning.metric]
    if tuning.direction is not None and tuning.direction != own:
        better = "higher" if own == "maximize" else "lower"
        return [loaded.problem(("tuning", "direction"), f"{tuning.metric} is better {better}, so {tuning.direction} "
                                                        f"would pick the worst trial; write {own} or leave direction out")]
    return []


def _pruner_problems(loaded: LoadedYaml, tuning: TuningSpec) -> list[SpecProblem]:
    """The pruner's options: only those of its type, and settings under which it can still stop a trial."""
    pruner = tuning.pruner
    here = ("tuning", "pruner")
    problems: list[SpecProblem] = []
    takes = PRUNER_DEFAULTS[pruner.type]
    for option in sorted(pruner.model_fields_set - {"type"}):
        if option not in takes:
            users = [name for name, options in PRUNER_DEFAULTS.items() if option in options]
            problems.append(loaded.problem((*here, option), f"{option} is an option of {' and '.join(users)}, not of "
                f"{pruner.type}; remove it" + (f" ({pruner.type} takes {', '.join(takes)})" if takes else "")))
    if problems:
        return problems
    options = pruner.options()
    if pruner.type in ("hyperband", "successive_halving"):
        if options["min_resource"] < 1:
            problems.append(loaded.problem((*here, "min_resource"), f"{pruner.type}'s first rung needs min_resource >= 1 "
                                                                    "(percent of a trial)"))
        else:
            rate = options.get("min_early_stopping_rate", 0)
            first = options["min_resource"] * options["reduction_factor"] ** rate
            if first >= 100:
                at = "min_early_stopping_rate" if "min_early_stopping_rate" in pruner.model_fields_set else "min_resource"
                problems.append(loaded.problem((*here, at), f"the first rung lands at {first}% of a trial (min_resource x "
                    "reduction_factor^min_early_stopping_rate), where every trial has finished: no trial would be "
                    "stopped; lower it below 100%"))
    if "n_startup_trials" in takes and options["n_startup_trials"] >= tuning.n_trials:
        problems.append(loaded.problem((*here, "n_startup_trials"), f"n_startup_trials {options['n_startup_trials']} "
            f"is not below n_trials {tuning.n_trials}: no trial would ever be stopped; lower it, or use pruner: none"))
    return problems


def _launcher_problems(loaded: LoadedYaml) -> list[SpecProblem]:
    """training.launcher against training.distributed and training.kubernetes."""
    problems: list[SpecProblem] = []
    data = loaded.data
    launcher = _get(data, "training", "launcher") or "local"
    nnodes = _get(data, "training", "distributed", "nnodes")
    nproc = _get(data, "training", "distributed", "nproc_per_node")
    kubernetes = _get(data, "training", "kubernetes")
    if launcher == "kubernetes" and not isinstance(kubernetes, dict):
        problems.append(loaded.problem(("training", "launcher"),
            "launcher 'kubernetes' needs a training.kubernetes section: at least `image:` (the trainer image) "
            "and `resources:`; see docs/kubernetes.md"))
    if launcher == "local" and isinstance(nnodes, int) and not isinstance(nnodes, bool) and nnodes > 1:
        problems.append(loaded.problem(("training", "distributed", "nnodes"),
            f"nnodes {nnodes} needs launcher 'kubernetes' (one pod per node); the local launcher runs on one "
            "machine: set nnodes: 1 or training.launcher: kubernetes"))
    elastic = _get(data, "training", "distributed", "elastic")
    if isinstance(elastic, dict):
        where = ("training", "distributed", "elastic")
        if launcher != "kubernetes":
            problems.append(loaded.problem(where, "elastic training needs launcher 'kubernetes' (nodes are pods "
                                                  "of an Indexed Job): remove elastic or set training.launcher: "
                                                  "kubernetes"))
        strategy = _get(data, "training", "distributed", "strategy") or "ddp"
        if strategy != "ddp":
            problems.append(loaded.problem(where, f"elastic training resumes at another world size, which strategy "
                                                  f"{strategy!r} cannot (DeepSpeed ZeRO partitions its optimizer state "
                                                  "per rank): use strategy ddp or remove elastic"))
        most = elastic.get("max_nodes")
        if nnodes is not None and isinstance(most, int) and nnodes != most:
            problems.append(loaded.problem(("training", "distributed", "nnodes"),
                f"nnodes {nnodes} but elastic.max_nodes {most}: with elastic the Job starts max_nodes pods; "
                "leave nnodes out or set it to max_nodes"))
    gpus = _get(kubernetes, "resources", "gpus") if isinstance(kubernetes, dict) else None
    nproc = 1 if nproc is None else nproc
    if launcher == "kubernetes" and isinstance(gpus, int) and not isinstance(gpus, bool) and gpus > 0 \
            and isinstance(nproc, int) and nproc != gpus:
        problems.append(loaded.problem(("training", "kubernetes", "resources", "gpus"),
            f"{gpus} GPU(s) per pod but training.distributed.nproc_per_node is {nproc}; torchrun starts one process "
            f"per GPU: set both to the same number"))
    problems.extend(_environment_problems(loaded, kubernetes if isinstance(kubernetes, dict) else {}))
    problems.extend(_pod_metadata_problems(loaded, kubernetes if isinstance(kubernetes, dict) else {}))
    return problems


def _pod_metadata_problems(loaded: LoadedYaml, kubernetes: dict[str, Any]) -> list[SpecProblem]:
    """Pod label and annotation keys a spec may not set (the domains the cluster's controllers read), and
    label keys and values Kubernetes would refuse only when the pod is created."""
    problems: list[SpecProblem] = []
    for key, what in (("labels", "label"), ("annotations", "annotation")):
        metadata = kubernetes.get(key)
        for name, value in metadata.items() if isinstance(metadata, dict) else ():
            path = ("training", "kubernetes", key, name)
            problem = metadata_key_problem(str(name), what=what)
            if problem is None and what == "label" and isinstance(value, str):
                problem = label_value_problem(value)
            if problem is not None:
                problems.append(loaded.problem(path, problem))
    capacity = kubernetes.get("capacity")
    selectors: list[tuple[FieldPath, Any]] = [(("training", "kubernetes", "node_selector"), kubernetes.get("node_selector"))]
    for kind in ("spot", "on_demand"):
        placement = capacity.get(kind) if isinstance(capacity, dict) else None
        if isinstance(placement, dict):
            selectors.append((("training", "kubernetes", "capacity", kind, "node_selector"), placement.get("node_selector")))
    for at, selector in selectors:
        # Node labels are the cluster's (node.kubernetes.io/..., karpenter.sh/...): syntax only, no reserved domains.
        for name, value in selector.items() if isinstance(selector, dict) else ():
            problem = key_syntax_problem(str(name), what="node label")
            if problem is None and isinstance(value, str):
                problem = label_value_problem(value)
            if problem is not None:
                problems.append(loaded.problem((*at, name), problem))
    return problems


def _environment_problems(loaded: LoadedYaml, kubernetes: dict[str, Any]) -> list[SpecProblem]:
    """Variables a spec may not set (``trainpipe.spec.environment.reserved_env_reason``): what trainpipe or
    torchrun set, and what redirects code, credentials or outputs."""
    problems: list[SpecProblem] = []
    for key, from_secret in (("env", False), ("secret_env", True)):
        variables = kubernetes.get(key)
        for name in variables if isinstance(variables, dict) else {}:
            malformed = env_name_problem(str(name))
            if malformed is not None:
                problems.append(loaded.problem(("training", "kubernetes", key, name), malformed))
                continue
            reason = reserved_env_reason(str(name), from_secret=from_secret)
            if reason is None or (not from_secret and looks_like_credential(str(name))):
                continue  # a credential in plain env has its own message (spec.kubernetes)
            fix = ("remove it, or name the variable the credential's program reads" if from_secret else
                   "remove it; credentials and endpoints come from a Secret the platform owns (secret_env or "
                   "env_from_secrets). Tuning variables such as NCCL_DEBUG are allowed")
            problems.append(loaded.problem(("training", "kubernetes", key, name),
                                           f"{name!r} is reserved ({reason}); {fix}"))
    return problems


def _param_problems(loaded: LoadedYaml, spec: PipelineSpec) -> list[SpecProblem]:
    """Each run parameter's default (its own, or the spec value it overrides) must satisfy its type
    and bounds (``param_bounds``: the declared ones within the field's own). Airflow would reject such
    a Param only when the DAG is built, with a message that names neither the file nor the field;
    trainpipe checks it here, once, and so skips that check when building DAGs (ADR 0006)."""
    problems: list[SpecProblem] = []
    for name, param in spec.params.items():
        if name not in OVERRIDABLE_PARAMS:
            continue  # reported by _semantic_problems
        path, json_type = OVERRIDABLE_PARAMS[name]
        here = ("params", name)
        if param.minimum is not None and param.maximum is not None and param.minimum > param.maximum:
            problems.append(loaded.problem((*here, "maximum"),
                f"maximum {param.maximum:g} is below minimum {param.minimum:g}; swap them"))
            continue
        where: FieldPath
        default: Any
        if param.default is not None:
            default, source, where = param.default, "the default", (*here, "default")
        else:
            default, source, where = overridden_value(spec, name), ".".join(path), here
        if default is None:
            continue  # an optional hyperparameter left unset: the form offers it empty
        if json_type == "integer" and (isinstance(default, bool) or default != int(default)):
            problems.append(loaded.problem(
                where, f"{name} is a whole number, got {default!r}; write e.g. {int(default)}"))
            continue
        for bound in param_bounds(name, param):
            if bound.admits(default):
                continue
            if bound.source.startswith("params."):  # declared: keyword is "minimum" or "maximum"
                if bound.keyword == "minimum":
                    side, fix = "below", f"lower the minimum or raise {source}"
                else:
                    side, fix = "above", f"raise the maximum or lower {source}"
                problems.append(loaded.problem((*here, bound.keyword),
                    f"{source} {default:g} is {side} {bound.keyword} {bound.value:g}; {fix}"))
            else:
                problems.append(loaded.problem(where,
                    f"{source} {default:g} is not a valid {bound.source}: it must be {bound.describe()}"))
    return problems


def _retry_resource_problems(loaded: LoadedYaml, spec: PipelineSpec) -> list[SpecProblem]:
    """training.kubernetes.on_oom and capacity against the resources and placement they change."""
    from trainpipe.quantities import quantity_bytes, quantity_value

    section = spec.training.kubernetes
    if section is None:
        return []
    base = ("training", "kubernetes")
    problems: list[SpecProblem] = []
    resources = section.resources
    for name, request, limit in (("cpu", resources.cpu, resources.limits.cpu),
                                 ("memory", resources.memory, resources.limits.memory)):
        if limit is not None and quantity_value(limit) < quantity_value(request):
            problems.append(loaded.problem((*base, "resources", "limits", name), (
                f"the {name} limit {limit} is below the request resources.{name} {request}, which Kubernetes refuses: "
                f"raise the limit to at least {request}, or lower the request")))
    if section.on_oom is not None:
        ceiling = quantity_bytes(section.on_oom.max_memory)
        asked = [("memory", section.resources.memory), ("limits.memory", section.resources.limits.memory)]
        for name, value in asked:
            if value is not None and quantity_bytes(value) > ceiling:
                problems.append(loaded.problem((*base, "on_oom", "max_memory"), (
                    f"max_memory {section.on_oom.max_memory} is below resources.{name} {value}: a retry would ask "
                    f"for less than the first try; raise max_memory to at least {value}")))
                break
        batch = spec.training.batch_size
        if section.on_oom.reduce_batch and batch % 2:
            problems.append(loaded.problem((*base, "on_oom", "reduce_batch"), (
                f"reduce_batch halves training.batch_size after a CUDA OOM, and batch_size {batch} is odd: it cannot "
                f"be split into equal micro-batches; set batch_size to an even number such as {batch + 1} "
                "or leave reduce_batch out")))
    if section.capacity is not None:
        for kind in ("spot", "on_demand"):
            for key in getattr(section.capacity, kind).node_selector:
                if key in section.node_selector:
                    problems.append(loaded.problem((*base, "capacity", kind, "node_selector", key), (
                        f"{key} is also in training.kubernetes.node_selector ({section.node_selector[key]!r}); a "
                        f"capacity's labels are added to it: keep {key} in one of the two")))
    return problems


def validate_loaded(loaded: LoadedYaml) -> PipelineSpec:
    if not isinstance(loaded.data, dict):
        found = type(loaded.data).__name__ if loaded.data is not None else "an empty file"
        raise SpecError([loaded.problem((), f"a spec is a YAML mapping with pipeline_id, data, training, ...; found {found}")])
    problems: list[SpecProblem] = []
    spec = None
    try:
        spec = PipelineSpec.model_validate(loaded.data)
    except ValidationError as err:
        problems.extend(p for e in err.errors() for p in _pydantic_problems(loaded, e))
    reported = {(p.field_path, p.message) for p in problems}
    problems.extend(p for p in _semantic_problems(loaded) if (p.field_path, p.message) not in reported)
    if spec is not None:
        checkpoint = spec.training.checkpoint
        if spec.training.early_stopping is not None and (not checkpoint.keep_best
                                                         or checkpoint.validation_fraction == 0):
            # Judged on the validated values: a quoted "false" is False by then.
            problems.append(loaded.problem(("training", "early_stopping"), (
                "early stopping judges the validation loss: keep training.checkpoint.keep_best true and "
                "validation_fraction above 0")))
        problems.extend(_param_problems(loaded, spec))
        problems.extend(_tuning_problems(loaded, spec))
        problems.extend(_retry_resource_problems(loaded, spec))
    if problems or spec is None:
        problems.sort(key=lambda p: (p.file != loaded.file, p.file, p.line or 0, p.column or 0))
        raise SpecError(problems)
    return spec


def load_spec(path: Path, display_name: str | None = None) -> PipelineSpec:
    """Load and validate one spec file; raises ``SpecError`` listing every problem in it."""
    return validate_loaded(load_yaml_file(path, display_name))
