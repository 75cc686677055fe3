"""The names trainpipe gives things in MLflow, each written once: the experiment of a pipeline and every tag trainpipe
writes. The steps and the hook write them; the fleet view, ``trainpipe cost``, ``trainpipe model`` and ``reproduce``
read them. The trainer's own tags (trials, failures, world sizes) are its package's: ``trainpipe_trainer``.
"""

from __future__ import annotations

# The model family tags are the trainer contract's: the trainer writes them where it trains, and so do the steps.
from trainpipe_trainer.outcomes import (
    MODEL_FAMILY_DISTRIBUTION_TAG,
    MODEL_FAMILY_SHA256_TAG,
    MODEL_FAMILY_TAG,
    MODEL_FAMILY_VERSION_TAG,
    PRETRAINED_SHA256_TAG,
    PRETRAINED_URI_TAG,
)

# Each pipeline's runs are in the experiment ``trainpipe/<pipeline id>``.
EXPERIMENT_PREFIX = "trainpipe/"


def experiment_name(pipeline_id: str) -> str:
    return f"{EXPERIMENT_PREFIX}{pipeline_id}"


# -- Tags of an MLflow run --------------------------------------------------------------------------------------
# The DAG run a run belongs to (trainpipe.hooks.mlflow.MlflowHook.run_for_dag_run finds it by RUN_ID_TAG). Only
# the DAG run's own training carries RUN_ID_TAG: a study's runs carry STUDY_RUN_ID_TAG instead.
DAG_ID_TAG = "trainpipe.dag_id"
RUN_ID_TAG = "trainpipe.airflow_run_id"
STUDY_RUN_ID_TAG = "trainpipe.study_airflow_run_id"
TRY_NUMBER_TAG = "trainpipe.try_number"
DATASET_DIGEST_TAG = "trainpipe.dataset_digest"
SPEC_SHA256_TAG = "trainpipe.spec_sha256"
# Left out, never made up, when the specs are not a git checkout.
GIT_COMMIT_TAG = "trainpipe.git_commit"
# The run parameters a trigger overrode (JSON): reproduce applies them again.
PARAM_OVERRIDES_TAG = "trainpipe.param_overrides"
# validate's drift check (its report is the run's drift/drift_report.html).
DRIFT_REFERENCE_TAG = "trainpipe.drift_reference"
DRIFT_VERDICT_TAG = "trainpipe.drift_verdict"
DRIFT_FAILED_FEATURES_TAG = "trainpipe.drift_failed_features"
# "true" when every gate passed (evaluate writes it; the gate task then lets register run).
GATES_PASSED_TAG = "trainpipe.gates_passed"
# What `trainpipe cost --by` groups by (trainpipe.state.usage logs them with the usage metrics).
PIPELINE_TAG = "trainpipe.pipeline"
TEAM_TAG = "trainpipe.team"
# The resources a training's last try trained with (trainpipe.kubernetes.tries), copied onto the registered version.
RESOURCE_TAG_PREFIX = "trainpipe.resources."
# A study's parent run: its best trial.
BEST_TRIAL_TAG = "trainpipe.best_trial"
# The final training of a tuned pipeline: the trial it takes its parameters from. reproduce applies BEST_PARAMS_TAG
# (JSON, as Optuna stores them).
TUNING_STUDY_TAG = "trainpipe.tuning.study"
TUNING_BEST_TRIAL_TAG = "trainpipe.tuning.best_trial"
TUNING_BEST_VALUE_TAG = "trainpipe.tuning.best_value"
BEST_PARAMS_TAG = "trainpipe.tuning.best_params"
TUNING_PARENT_RUN_TAG = "trainpipe.tuning.parent_run_id"
# The trainer image reference of a Kubernetes training, as the spec wrote it (a tag may move), and the image the
# nodes ran, read back from the pods' status when training succeeded (`repo@sha256:...`; comma-separated when
# the nodes of one training ran different images).
TRAINER_IMAGE_TAG = "trainpipe.trainer_image"
TRAINER_IMAGE_DIGEST_TAG = "trainpipe.trainer_image_digest"
MODEL_FAMILY_TAGS = (MODEL_FAMILY_TAG, MODEL_FAMILY_DISTRIBUTION_TAG, MODEL_FAMILY_VERSION_TAG, MODEL_FAMILY_SHA256_TAG,
                     TRAINER_IMAGE_TAG, TRAINER_IMAGE_DIGEST_TAG, PRETRAINED_URI_TAG, PRETRAINED_SHA256_TAG)
# On the reproducing run: which version it reproduces, and whether the weights matched.
REPRODUCES_TAG = "trainpipe.reproduces"
REPRODUCED_MATCH_TAG = "trainpipe.reproduced_weights_match"

# -- Tags of a registered model version ---------------------------------------------------------------------------
# Lineage: the version's identity is (VERSION_DAG_ID_TAG, VERSION_RUN_ID_TAG), one version per DAG run; reproduce
# trains it again from the rest.
VERSION_DAG_ID_TAG = "dag_id"
VERSION_RUN_ID_TAG = "airflow_run_id"
VERSION_DATASET_DIGEST_TAG = "dataset_digest"
SPEC_FILE_TAG = "spec_file"
SPEC_FILE_SHA256_TAG = "spec_file_sha256"
SEED_TAG = "seed"
WEIGHTS_SHA256_TAG = "weights_sha256"
VERSION_GIT_COMMIT_TAG = "git_commit"
# Written when `register` gave the version the challenger alias: a re-run does not move it again.
STAGED_AT_TAG = "trainpipe.staged_at"
EVALUATION_REPORT_TAG = "trainpipe.evaluation_report"
# On a version a backtest registered (registration.backtest.register), and on its MLflow run: never promoted.
BACKTEST_TAG = "trainpipe.backtest"
# On every version: the end of the data window it was trained on; a run whose window ends earlier is a backtest.
WINDOW_END_TAG = "trainpipe.window_end"
# On every version: the sha256 of its training's inputs (trainpipe.state.training_cache); a run with the same key
# trains nothing.
TRAINING_KEY_TAG = "trainpipe.training_key"
PROMOTED_BY_TAG = "trainpipe.promoted_by"
PROMOTED_AT_TAG = "trainpipe.promoted_at"
PROMOTION_REASON_TAG = "trainpipe.promotion_reason"
PROMOTION_DETAILS_TAG = "trainpipe.promotion_details"
# The version the production alias left when this one got it ("none" for the first champion).
REPLACED_VERSION_TAG = "trainpipe.replaced_version"
REJECTED_TAG = "trainpipe.rejected"
REJECTED_BY_TAG = "trainpipe.rejected_by"
REJECTED_AT_TAG = "trainpipe.rejected_at"
REJECTION_REASON_TAG = "trainpipe.rejection_reason"
ROLLED_BACK_BY_TAG = "trainpipe.rolled_back_by"
ROLLED_BACK_AT_TAG = "trainpipe.rolled_back_at"
ROLLBACK_REASON_TAG = "trainpipe.rollback_reason"

# -- Tags of a registered model -----------------------------------------------------------------------------------
# The last promotions and rollbacks, one short line each, newest last (a version's own tags keep its latest
# promotion in full). Compact, because MLflow shows a model's tags at the top of its page:
# ``<at>\t<version>\t<replaced or ->\t<by>\t<reason, cut>``.
PROMOTION_HISTORY_TAG = "trainpipe.promotions"
# Before: a JSON list of up to 50 entries with reasons of up to 500 characters (read, never written).
PROMOTION_LOG_TAG = "trainpipe.promotion_log"
# Under a platform policy: the team that owns the model (written when trainpipe creates it). Register, promote and
# rollback refuse a model another team owns (ADR 0014).
OWNER_TAG = "trainpipe.owner"
