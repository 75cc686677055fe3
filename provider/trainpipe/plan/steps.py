"""The pipeline's steps, each once: task id, what it does, whether it holds GPUs.

The plan orders them, the DAG builder maps them to operators, the operators pull each other's XComs by
these ids and the fleet view reads their states: none of them writes a task id of its own.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Step:
    task_id: str
    summary: str
    uses_gpus: bool = False


SNAPSHOT = Step("snapshot", "immutable, content-addressed copy of the input window")
VALIDATE = Step("validate", "Great Expectations suite, volume, schema and drift checks vs the baseline version; stops "
                "the run before training on failure")
TRAIN = Step("train", "torchrun the trainer; resumes from this run's latest checkpoint", uses_gpus=True)
EVALUATE = Step("evaluate", "holdout metrics (per slice too) of the new model and of the current champion, the "
                "evaluation report")
GATE = Step("gate", "every gate must pass, else registration is skipped")
REGISTER = Step("register", "new MLflow model version (once per DAG run) with lineage tags and the challenger alias")
PROMOTE = Step("promote", "moves the production alias to the new version, the old one to the previous alias; tags "
               "who, when, why")
# With registration.approval required: between register and promote, waits for a person's answer.
APPROVE = Step("approve", "waits for a person to approve the version (Required Actions); reject or timeout-reject "
               "keeps it challenger, tagged rejected")
# Runs beside `train` (same upstream), outside the chain: watches its checkpoints for stalls.
WATCH_CHECKPOINTS = Step("watch_checkpoints", "beside train: logs checkpoint progress, fails when none is committed "
                         "for stall_timeout")
# With `tuning:`, between validate and train: the study, its trial workers (one mapped task), the best trial.
CREATE_STUDY = Step("create_study", "the run's Optuna study (sampler, pruner) and its MLflow parent run")
TRIALS = Step("trials", "max_parallel trial workers (mapped): each launches the trainer once and runs trials back "
              "to back", uses_gpus=True)
PICK_BEST = Step("pick_best", "the best complete trial; study plots on the parent run; train runs with its parameters")

STEPS: tuple[Step, ...] = (SNAPSHOT, VALIDATE, CREATE_STUDY, TRIALS, PICK_BEST, TRAIN, WATCH_CHECKPOINTS, EVALUATE,
                           GATE, REGISTER, APPROVE, PROMOTE)

# The chain of every pipeline; approval and tuning insert their steps into it, the sensor runs beside train.
TASK_ORDER: tuple[str, ...] = tuple(s.task_id for s in (SNAPSHOT, VALIDATE, TRAIN, EVALUATE, GATE, REGISTER, PROMOTE))
TUNING_TASKS: tuple[str, ...] = tuple(s.task_id for s in (CREATE_STUDY, TRIALS, PICK_BEST))
# Tasks that hold GPUs: they take the pool with one slot per GPU.
GPU_TASKS: tuple[str, ...] = tuple(s.task_id for s in STEPS if s.uses_gpus)
TRAIN_TASK = TRAIN.task_id
TRIALS_TASK = TRIALS.task_id
APPROVE_TASK = APPROVE.task_id
CHECKPOINT_SENSOR = WATCH_CHECKPOINTS.task_id

_TASK_SUMMARIES = {s.task_id: s.summary for s in STEPS}
_GATE_SUMMARIES = {
    "skip": GATE.summary,
    "fail": "every gate must pass, else the run fails (nothing is registered)",
}
