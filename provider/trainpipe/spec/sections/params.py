"""The spec's ``params:`` section: run parameters a trigger may set."""

from __future__ import annotations

from pydantic import Field

from trainpipe.spec.sections.common import SpecModel

# The settings a run parameter or a hyperparameter search may change, each once: name -> (path in the
# spec, JSON Schema type of a run parameter or None when only a search sets it, the search's kind or
# None when only a run parameter sets it). A search's kind: "float", "int", or "layers" (a list of sizes).
# A path under training.model.params is a family's own parameter: its name is the family's alone and its values
# are bounded by the family's check (spec.validate); a run parameter cannot reach one (the trigger form and the
# plan's run overrides read typed fields), so those are tuned only.
_RUN_SETTINGS: dict[str, tuple[tuple[str, ...], str | None, str | None]] = {
    "epochs": (("training", "epochs"), "integer", None),
    "batch_size": (("training", "batch_size"), "integer", "int"),
    "learning_rate": (("training", "learning_rate"), "number", "float"),
    "seed": (("training", "seed"), "integer", None),
    "dropout": (("training", "model", "dropout"), "number", "float"),
    "hidden_layers": (("training", "model", "hidden_layers"), None, "layers"),
    "gradient_clip_norm": (("training", "optimization", "gradient_clip_norm"), "number", "float"),
    "warmup_steps": (("training", "optimization", "warmup_steps"), "integer", "int"),
    "weight_decay": (("training", "optimization", "weight_decay"), "number", "float"),
    "decision_threshold": (("evaluation", "decision_threshold"), "number", None),
    "max_length": (("training", "model", "params", "max_length"), None, "int"),
    "lora_r": (("training", "model", "params", "lora", "r"), None, "int"),
}
# A family's own tuned parameters: name -> (family, the params that must be set for it, as key -> value).
FAMILY_SETTINGS: dict[str, tuple[str, dict[str, str]]] = {
    "max_length": ("transformer", {}),
    "lora_r": ("transformer", {"trainable": "lora"}),
}
# Param name -> (path in the spec, JSON Schema type). Only these can be overridden per run.
OVERRIDABLE_PARAMS: dict[str, tuple[tuple[str, ...], str]] = {
    name: (path, json_type) for name, (path, json_type, _) in _RUN_SETTINGS.items() if json_type is not None}


class ParamSpec(SpecModel):
    default: float | int | None = Field(
        default=None, description="Default shown in the trigger form; the spec's own value when omitted.", examples=[0.003]
    )
    description: str = Field(default="", description="Help text in the trigger form.", examples=["Adam learning rate"])
    minimum: float | None = Field(default=None, description="Smallest accepted value.", examples=[0.00001])
    maximum: float | None = Field(default=None, description="Largest accepted value.", examples=[0.1])
