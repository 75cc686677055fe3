"""The pruning benchmark's replay horizon against real Optuna: up to it, a pruned study proposes exactly
the points of its unpruned baseline; at it, TPE proposes another point.

`benchmarks/hpo_pruning.py` replays pruners on an unpruned study's learning curves and says up to which
trial the replay stands for a real pruned study (``faithful_horizon``, a model of how Optuna's TPE
splits trials). docs/benchmarks.md rests its pruner choice on that claim, so this runs both studies for
real (the trial workers' own sampler, ``build_sampler``; an in-memory storage) on curves that cross: the
trials that are best at the end look worst early, so the pruner stops some of them and the search forks.
"""

from __future__ import annotations

import importlib.util
import math

import optuna
import pytest

from tests.support import REPO
from trainpipe_trainer.tuning import build_sampler, make_pruner, tpe_startup_trials

N_TRIALS = 24
STEPS = range(5, 101, 5)


def _benchmark():
    spec = importlib.util.spec_from_file_location("hpo_pruning", REPO / "benchmarks" / "hpo_pruning.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def curve(params: dict[str, float]) -> dict[int, float]:
    # The final value is best near x = 0.3; early on, a large x looks better (the curves cross).
    x, y = params["x"], params["y"]
    return {step: (x - 0.3) ** 2 + 0.1 * y + (1 - x) * 10 / step for step in STEPS}


def run_study(name: str, pruner: optuna.pruners.BasePruner) -> list[tuple[dict[str, float], bool]]:
    """Each trial's parameters and whether it ran to the end."""
    study = optuna.create_study(study_name=name, direction="minimize", pruner=pruner,
                                sampler=build_sampler("tpe", seed=3, n_trials=N_TRIALS, stream=0))
    trials = []
    for _ in range(N_TRIALS):
        trial = study.ask()
        params = {"x": trial.suggest_float("x", 0.0, 1.0), "y": trial.suggest_float("y", 0.0, 1.0)}
        values = curve(params)
        for step in STEPS:
            trial.report(values[step], step)
            if step < STEPS[-1] and trial.should_prune():
                study.tell(trial, state=optuna.trial.TrialState.PRUNED)
                trials.append((params, False))
                break
        else:
            study.tell(trial, values[STEPS[-1]])
            trials.append((params, True))
    return trials


@pytest.mark.parametrize(("pruner", "tpe_trials_before_fork"), [
    # Stops the best start-up trial: TPE's very first proposal forks.
    ({"type": "successive_halving", "min_resource": 5, "reduction_factor": 3}, 0),
    # Keeps TPE's best few for three proposals, which the pruned study makes as the baseline did.
    ({"type": "median", "n_startup_trials": 2, "min_resource": 5}, 3),
])
def test_a_pruned_study_proposes_the_baselines_points_up_to_the_replays_horizon_and_forks_there(
        pruner, tpe_trials_before_fork):
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    bench = _benchmark()
    baseline_trials = run_study("horizon", optuna.pruners.NopPruner())
    curves = [(curve(params), 1.0) for params, _ in baseline_trials]
    finals = [c[STEPS[-1]] for c, _ in curves]
    baseline = {"direction": "minimize", "curves": curves, "compute": float(N_TRIALS), "best": min(finals)}

    horizon = bench.replay(baseline, pruner, "validation_loss", "horizon")["horizon"]

    from trainpipe.plan.build import pruner_arguments
    from trainpipe.spec.sections.tuning import PrunerSpec

    spec = PrunerSpec.model_validate(pruner)
    pruned_trials = run_study("horizon", make_pruner(spec.type, pruner_arguments(spec)))
    assert horizon == tpe_startup_trials(N_TRIALS) + tpe_trials_before_fork
    assert horizon < N_TRIALS, "the crossing curves must make the pruner fork the search, or this proves nothing"
    assert [p for p, _ in pruned_trials[:horizon]] == [p for p, _ in baseline_trials[:horizon]]
    assert not math.isclose(pruned_trials[horizon][0]["x"], baseline_trials[horizon][0]["x"])
