"""Preemption: time from SIGTERM to exit, the synchronous save inside it, and steps lost, per model size.

    python benchmarks/preemption.py [--models demo,100m] [--nproc 2]   # about 5 minutes on 2 cores

For each model the trainer runs as the launchers run it (``python -m trainpipe_trainer.elastic``,
torchrun with the preempted exit code) in its own process group, with tracking to a local sqlite
store. Once a few steps are done, the whole group gets SIGTERM (what ``kill -TERM`` of a launcher's
group, a container stop or a pod deletion does). Measured:

- SIGTERM -> commit: until rank 0 reported the checkpoint of its step committed (all ranks saved).
- SIGTERM -> exit: until torchrun exited (every rank stopped: tracking closed, process group torn down).
- save: the synchronous checkpoint of the preempted step (metric ``checkpoint_blocked_ms``), and its size.
- steps lost: steps done before the signal that the committed checkpoint does not hold. Target 0.
- resume: a second launch resumes at the committed step (checked), time to its first step.

Seed target: a save under 30 s (well inside Kubernetes' default 30 s grace period, and inside the
2 min ``training.kubernetes.termination_grace_period`` trainpipe sets). Models: ``demo`` is the
example spec's MLP (32, 16) on 15 inputs; ``100m`` an MLP of about 100 million parameters (256
inputs, 8192-8192-4096), whose checkpoint holds weights and both AdamW moments (about 1.2 GB).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "trainer_image"))

MODELS = {
    # name: (inputs, hidden layers, rows, batch size)
    "demo": (15, (32, 16), 200_000, 64),
    "100m": (256, (8192, 8192, 4096), 4_000, 16),
}
SAVE_TARGET_SECONDS = 30.0


@dataclass
class Outcome:
    model: str
    parameters: int
    nproc: int
    step_at_signal: int
    committed_step: int
    sigterm_to_commit: float
    sigterm_to_exit: float
    save_seconds: float
    checkpoint_mb: float
    exit_code: int
    resume_to_first_step: float

    @property
    def steps_lost(self) -> int:
        return max(self.step_at_signal - self.committed_step, 0)


def _parameters(inputs: int, hidden: tuple[int, ...]) -> int:
    sizes = (inputs, *hidden, 1)
    return sum(a * b + b for a, b in zip(sizes, sizes[1:], strict=False))


def _data(path: Path, inputs: int, rows: int) -> tuple[str, ...]:
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(0)
    x = rng.normal(size=(rows, inputs)).astype(np.float32)
    frame = pd.DataFrame(x, columns=[f"f{i}" for i in range(inputs)])
    frame["label"] = (x[:, 0] + 0.5 * x[:, 1] > 0).astype(np.int64)
    frame.to_parquet(path)
    return tuple(frame.columns[:-1])


def _config(work: Path, model: str) -> Path:
    inputs, hidden, rows, batch = MODELS[model]
    data = work / "train.parquet"
    features = _data(data, inputs, rows)
    config = {
        "pipeline_id": f"bench-{model}", "task": "binary_classification", "train_data_uri": str(data),
        "features": list(features), "label": "label", "model": {"hidden_layers": list(hidden)},
        "epochs": 1, "batch_size": batch, "learning_rate": 1e-4, "seed": 0,
        # No periodic checkpoint: the one taken on SIGTERM is the only one.
        "checkpoint": {"root_uri": str(work / "checkpoints"), "every_n_steps": 100_000, "keep_best": False},
        "tracking": {"tracking_uri": f"sqlite:///{work / 'mlflow.db'}", "experiment_name": "bench",
                     "log_every_n_steps": 1, "system_metrics_every_seconds": 3600},
        "output_uri": str(work / "output"),
    }
    path = work / "trainer_config.json"
    path.write_text(json.dumps(config))
    return path


def _launch(config: Path, nproc: int, log: Path) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "MLFLOW_DISABLE_TELEMETRY": "true",
           "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "120",
           "PYTHONPATH": os.pathsep.join([str(REPO / "trainer_image"), os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-m", "trainpipe_trainer.elastic", "--standalone", f"--nproc_per_node={nproc}",
               "-m", "trainpipe_trainer", "--config", str(config)]
    return subprocess.Popen(command, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT,
                            start_new_session=True, cwd=config.parent)


def _last_step(log: Path) -> int:
    return max((int(s) for s in re.findall(r"^step (\d+)/", log.read_text(), flags=re.MULTILINE)), default=0)


def _wait_for_step(process: subprocess.Popen, log: Path, step: int, timeout: float = 900) -> float:
    started = time.monotonic()
    while _last_step(log) < step:
        if process.poll() is not None:
            raise RuntimeError(f"the trainer exited before step {step}:\n{log.read_text()[-3000:]}")
        if time.monotonic() - started > timeout:
            raise RuntimeError(f"no step {step} within {timeout} s")
        time.sleep(0.05)
    return time.monotonic() - started


def measure(model: str, nproc: int, work: Path) -> Outcome:
    from mlflow import MlflowClient

    from trainpipe_trainer.outcomes import preempted_step

    config = _config(work, model)
    log = work / "first.log"
    process = _launch(config, nproc, log)
    try:
        _wait_for_step(process, log, 3)
        seen = _last_step(log)
        signalled = time.monotonic()
        os.killpg(process.pid, signal.SIGTERM)
        committed_at = None
        while process.poll() is None:
            if committed_at is None and "received SIGTERM: committed checkpoint" in log.read_text():
                committed_at = time.monotonic() - signalled
            if time.monotonic() - signalled > 600:
                raise RuntimeError("the trainer did not exit within 600 s of SIGTERM")
            time.sleep(0.05)
        code = process.returncode
        sigterm_to_exit = time.monotonic() - signalled
        sigterm_to_commit = committed_at if committed_at is not None else sigterm_to_exit
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    text = log.read_text()
    committed = next((s for s in map(preempted_step, text.splitlines()) if s is not None), None)
    if committed is None:
        raise RuntimeError(f"no preempted checkpoint reported:\n{text[-3000:]}")
    step_dir = work / "checkpoints" / f"step-{committed}"
    size = sum(p.stat().st_size for p in step_dir.rglob("*") if p.is_file())
    client = MlflowClient(f"sqlite:///{work / 'mlflow.db'}")
    run = client.search_runs([client.get_experiment_by_name("bench").experiment_id])[0]
    blocked = [m for m in client.get_metric_history(run.info.run_id, "checkpoint_blocked_ms") if m.step == committed]
    resumed_log = work / "resumed.log"
    again = _launch(config, nproc, resumed_log)
    try:
        resume_time = _wait_for_step(again, resumed_log, committed + 1)
        if f"resumed from step {committed}" not in resumed_log.read_text():
            raise RuntimeError(f"the second launch did not resume at step {committed}")
    finally:
        # SIGTERM, not SIGKILL: torchrun's workers run in sessions of their own, only torchrun stops them.
        os.killpg(again.pid, signal.SIGTERM)
        again.wait(timeout=600)
    inputs, hidden, _rows, _batch = MODELS[model]
    return Outcome(model=model, parameters=_parameters(inputs, hidden), nproc=nproc, step_at_signal=seen,
                   committed_step=committed, sigterm_to_commit=sigterm_to_commit,
                   sigterm_to_exit=sigterm_to_exit,
                   save_seconds=blocked[0].value / 1000 if blocked else float("nan"),
                   checkpoint_mb=size / 1e6, exit_code=code, resume_to_first_step=resume_time)


def main() -> int:
    from trainpipe_trainer.outcomes import PREEMPTED_EXIT_CODE

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="demo,100m", help=f"comma-separated, of {', '.join(MODELS)}")
    parser.add_argument("--nproc", type=int, default=2, help="processes per model (torchrun --nproc_per_node)")
    args = parser.parse_args()
    print(f"load average before: {', '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} cores")
    print(f"{'model':>6} {'params':>8} {'ranks':>5} {'signal@':>7} {'saved':>6} {'lost':>4} {'exit':>4} "
          f"{'->commit':>8} {'->exit':>7} {'save':>7} {'size':>8} {'resume':>7}")
    outcomes = []
    for model in args.models.split(","):
        with tempfile.TemporaryDirectory(prefix=f"trainpipe-preemption-{model}-") as work:
            outcome = measure(model, args.nproc, Path(work))
        outcomes.append(outcome)
        print(f"{model:>6} {outcome.parameters / 1e6:>7.1f}M {outcome.nproc:>5} {outcome.step_at_signal:>7} "
              f"{outcome.committed_step:>6} {outcome.steps_lost:>4} {outcome.exit_code:>4} "
              f"{outcome.sigterm_to_commit:>7.1f}s {outcome.sigterm_to_exit:>6.1f}s "
              f"{outcome.save_seconds:>6.1f}s {outcome.checkpoint_mb:>6.0f}MB "
              f"{outcome.resume_to_first_step:>6.1f}s", flush=True)
    print(f"load average after: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"targets: steps lost 0 (worst {max(o.steps_lost for o in outcomes)}); save < {SAVE_TARGET_SECONDS:.0f} s "
          f"(worst {max(o.save_seconds for o in outcomes):.1f} s); exit code {PREEMPTED_EXIT_CODE} "
          f"({'all' if all(o.exit_code == PREEMPTED_EXIT_CODE for o in outcomes) else 'NOT all'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
