"""Every example spec is a test: the DAG folder loads with no import errors, one DAG per spec."""

from __future__ import annotations

from itertools import pairwise

import pytest

from tests.support import REPO, dag_bag
from trainpipe.compile.compiler import compile_directory, spec_files
from trainpipe.plan.build import task_order
from trainpipe.plan.steps import APPROVE_TASK, CHECKPOINT_SENSOR, TUNING_TASKS
from trainpipe.settings import Settings


@pytest.mark.integration
def test_dags_folder_loads_one_dag_per_spec_in_task_order(airflow_db):
    bag = dag_bag()

    assert bag.import_errors == {}
    plans = {plan.dag_id: plan for plan in compile_directory(REPO / "dag_configs", settings=Settings.from_env()).plans.values()}
    expected = set(plans)
    assert len(expected) == len(spec_files(REPO / "dag_configs")) >= 2
    assert set(bag.dag_ids) == expected
    approving = {dag_id for dag_id in expected if APPROVE_TASK in bag.get_dag(dag_id).task_ids}
    # The examples promote directly (`make demo`), but for the one that shows human approval.
    assert approving == {"fraud_detector_approval"}
    for dag_id in expected:
        dag = bag.get_dag(dag_id)
        order = list(task_order(approval_required=dag_id in approving))
        # A tuned spec searches between validate and train.
        if plans[dag_id].tuning is not None:
            order[order.index("train"):order.index("train")] = TUNING_TASKS
        assert set(dag.task_ids) == {*order, CHECKPOINT_SENSOR}
        for upstream, downstream in pairwise(order):
            assert dag.get_task(downstream).upstream_task_ids == {upstream}
        # The checkpoint sensor runs beside train (same upstream) and nothing waits for it.
        assert dag.get_task(CHECKPOINT_SENSOR).upstream_task_ids == dag.get_task("train").upstream_task_ids
        assert dag.get_task(CHECKPOINT_SENSOR).downstream_task_ids == set()


def test_ranker_runs_nightly_at_midnight():
    plans = compile_directory(REPO / "dag_configs", settings=Settings.from_env()).plans
    assert plans["search_ranker_nightly"].schedule == "0 0 * * *"
    assert plans["fraud_detector"].schedule == "@daily"
