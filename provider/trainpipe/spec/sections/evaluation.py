"""The spec's ``evaluation:`` section: metrics, slices and gates."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, WithJsonSchema, model_validator

from trainpipe.spec.sections.common import SpecModel

_GATE = re.compile(
    r"^\s*(?:worst_slice\(\s*(?P<slice_metric>[A-Za-z_][\w@]*)\s*\)|(?P<metric>[A-Za-z_][\w@]*))"
    r"\s*(?P<op>>=|<=|>|<)\s*(?:(?P<baseline>baseline)(?:\s*(?P<margin_sign>[+-])\s*(?P<margin>\d+(?:\.\d+)?|\.\d+))?"
    r"|(?P<sign>[+-])?\s*(?P<value>\d+(?:\.\d+)?|\.\d+)\s*(?P<pct>%)?)\s*$"
)
# The right-hand side that compares with the evaluation's baseline model ("rmse <= baseline").
BASELINE = "baseline"
# The gate on the worst slice; "min_slice"/"max_slice" are refused with a pointer to it, since
# which of the two is the worst depends on the metric.
WORST_SLICE = "worst_slice"


class GateSpec(SpecModel):
    metric: str = Field(description="Metric computed by evaluation.", examples=["auc"])
    op: Literal[">=", ">", "<=", "<"] = Field(description="Comparison.", examples=[">="])
    threshold: float = Field(description="Absolute value, or relative change for relative gates (0.005 = 0.5%).", examples=[0.8])
    relative: bool = Field(
        default=False,
        description="Compare the change over the current champion instead of the value; passes when there is no champion yet.",
        examples=[False],
    )
    worst_slice: bool = Field(
        default=False,
        description="Apply the gate to the worst value over every slice of evaluation.slices (the lowest, or the "
        "highest for log_loss, rmse, mae, perplexity and loss) instead of the whole holdout.",
        examples=[False],
    )
    baseline: bool = Field(
        default=False,
        description="Compare with the baseline model of the evaluation (ridge, logistic regression or a linear "
        "scorer, fitted on the same train split) plus threshold: 'rmse <= baseline', 'auc >= baseline + 0.01'.",
        examples=[False],
    )

    @model_validator(mode="after")
    def _one_reference(self) -> GateSpec:
        if self.baseline and self.relative:
            raise ValueError("a gate compares with the champion (relative) or with the baseline, not both")
        if self.baseline and self.worst_slice:
            raise ValueError("the baseline is scored on the whole holdout: write 'METRIC OP baseline' without "
                             f"{WORST_SLICE}()")
        return self

    def __str__(self) -> str:
        metric = f"{WORST_SLICE}({self.metric})" if self.worst_slice else self.metric
        if self.baseline:
            margin = f" {'-' if self.threshold < 0 else '+'} {abs(self.threshold):g}" if self.threshold else ""
            return f"{metric} {self.op} {BASELINE}{margin}"
        if self.relative:
            return f"{metric} {self.op} {self.threshold * 100:+g}% vs champion"
        return f"{metric} {self.op} {self.threshold:g}"


def _parse_gate(value: Any) -> Any:
    if not isinstance(value, str):
        return value
    match = _GATE.match(value)
    if not match:
        wrong_slice = re.match(r"^\s*(min|max)_slice\(\s*([^)\s]*)", value)
        if wrong_slice:
            raise ValueError(
                f"cannot read gate {value!r}: write '{WORST_SLICE}({wrong_slice[2]}) OP VALUE'; the worst slice is "
                "the lowest value, or the highest for log_loss, rmse, mae, perplexity and loss"
            )
        raise ValueError(
            f"cannot read gate {value!r}: write 'METRIC OP VALUE' such as 'auc >= 0.80', a relative "
            "improvement over the champion such as 'ndcg@10 >= +0.5%', a comparison with the baseline model "
            f"such as 'rmse <= baseline' or 'auc >= baseline + 0.01', or a gate on the worst slice such as "
            f"'{WORST_SLICE}(auc) >= 0.75'"
        )
    on_slices = match["slice_metric"] is not None
    metric = match["slice_metric"] if on_slices else match["metric"]
    if match["baseline"]:
        margin = float(match["margin"] or 0.0) * (-1 if match["margin_sign"] == "-" else 1)
        return {"metric": metric, "op": match["op"], "threshold": margin, "relative": False,
                "worst_slice": on_slices, "baseline": True}
    # A relative gate bounds the change over the champion from below (+ is better, whichever way the metric runs):
    # with < or <= it would pass only a model no better than the champion.
    relative_op = ">=" if match["op"] in ("<", "<=") else match["op"]
    if match["pct"] and not match["sign"]:
        # "rmse < 65 %" reads like an absolute bound in percent; a change over the champion says its direction.
        raise ValueError(
            f"cannot read gate {value!r}: a relative gate (a change over the champion) needs an explicit sign: "
            f"write '{metric} {relative_op} +{match['value']}%' or '{metric} {relative_op} -{match['value']}%' "
            "(the change over the champion, + for better); for an absolute bound drop the %"
        )
    if match["sign"] and relative_op != match["op"]:
        raise ValueError(
            f"cannot read gate {value!r}: a relative gate is the change over the champion, + for better whichever "
            f"way {metric} runs, so '{match['op']}' would pass only a model no better than the champion: write "
            f"'{metric} >= -N%' for at most N% worse, or '{metric} >= +N%' for at least N% better"
        )
    number = float(match["value"])
    relative = bool(match["sign"] or match["pct"])
    if match["pct"]:
        number /= 100.0
    if match["sign"] == "-":
        number = -number
    return {"metric": metric, "op": match["op"], "threshold": number, "relative": relative, "worst_slice": on_slices}


class EvaluationSpec(SpecModel):
    metrics: list[str] = Field(min_length=1, description="Metrics computed on the holdout.", examples=[["auc", "f1"]])
    gates: list[
        Annotated[
            GateSpec,
            BeforeValidator(_parse_gate),
            WithJsonSchema({
                "anyOf": [
                    {"type": "string", "pattern": r"^\s*([A-Za-z_][\w@]*|worst_slice\(\s*[A-Za-z_][\w@]*\s*\))\s*(>=|<=|>|<)\s*"
                                                  r"(baseline(\s*[+-]\s*(\d+(\.\d+)?|\.\d+))?|[+-]?\s*(\d+(\.\d+)?|\.\d+)\s*%?)\s*$"},
                    GateSpec.model_json_schema(),
                ],
                "description": "'METRIC OP VALUE' (absolute), 'METRIC OP +N%' (relative to the champion: the sign "
                "is required), 'METRIC OP baseline [+|- MARGIN]' (against the baseline model), the first two "
                "also on 'worst_slice(METRIC)' (the worst slice of evaluation.slices).",
            }),
        ]
    ] = Field(
        default_factory=list,
        description="All must pass before the model is registered: 'auc >= 0.80' (absolute), "
        "'auc >= +0.1%' (relative to the current champion; the sign is required), 'auc >= baseline + 0.01' "
        "(against the baseline model fitted on the same split), or 'worst_slice(auc) >= 0.75' (the worst slice "
        "of evaluation.slices: the lowest value, the highest for log_loss, rmse, mae, perplexity and loss).",
        examples=[["auc >= 0.80", "auc >= +0.1%", "auc >= baseline + 0.01", "worst_slice(auc) >= 0.75"]],
    )
    slices: Annotated[
        list[str],
        BeforeValidator(lambda value: [value] if isinstance(value, str) else value),
        WithJsonSchema({"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]}),
    ] = Field(
        default_factory=list,
        description="Columns of the data to slice the holdout by: every metric is computed for each value of each "
        "column (missing values form their own slice), shown in the evaluation report, and gated by "
        "'worst_slice(METRIC)' gates. One column or a list; the columns need not be features, and validation "
        "requires them in the data.",
        examples=[["region"]],
    )
    holdout_fraction: float = Field(
        default=0.2,
        gt=0,
        lt=1,
        description="Share of the snapshot held out for evaluation (by row, or by query for ranking).",
        examples=[0.2],
    )
    decision_threshold: float = Field(
        default=0.5, gt=0, lt=1, description="Binary classification: probability above which a row is positive.", examples=[0.5]
    )
    on_gate_failure: Literal["skip", "fail"] = Field(
        default="skip",
        description="When a gate fails: 'skip' ends the run successfully without registering (the gate task "
        "short-circuits); 'fail' fails the gate task and so the run, with the gate table as the error. Either way "
        "the table is logged at WARNING, the run's note says which gates failed, and notify.*.events: gate_failure "
        "sends it.",
        examples=["fail"],
    )
