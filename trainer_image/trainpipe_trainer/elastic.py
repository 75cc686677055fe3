"""``python -m trainpipe_trainer.elastic [torchrun options] -m trainpipe_trainer --config URI``: torchrun,
with an exit code that says "preempted".

torchrun itself exits 1 whatever ended its workers, and with a traceback when it is sent SIGTERM
(a pod's deletion or eviction, ``kill -TERM``). Its SIGTERM handling is kept as it is: it passes
the signal on to every worker and waits ``TORCH_ELASTIC_SHUTDOWN_TIMEOUT`` seconds (the launch sets
it inside the grace period) before killing them, time in which each rank finishes its step and
commits it. This wrapper only maps the outcome: a SIGTERM, or workers that exited with
``PREEMPTED_EXIT_CODE`` (some perhaps killed by torchrun's SIGTERM while exiting after the commit),
exit with that code, which the local launcher relaunches on and a Job's ``podFailurePolicy``
ignores. Anything else exits as torchrun would.

One process on one node (``--standalone --nnodes=1 --nproc_per_node=1``, every local run and trial
worker by default) skips torchrun's agent: it cost two seconds of every launch (its own interpreter
importing torch) for nothing a single rank needs. The rank is started here with the variables
torchrun gives it, and this process does what the agent did for it: it passes a signal on, gives
the rank ``TORCH_ELASTIC_SHUTDOWN_TIMEOUT`` seconds after a SIGTERM, and maps the exit code the
same way. Any other shape of launch runs torchrun unchanged.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from types import FrameType

from trainpipe_trainer.config import SHUTDOWN_TIMEOUT_ENV
from trainpipe_trainer.console import write_whole_lines
from trainpipe_trainer.outcomes import CUDA_OOM_EXIT_CODE, PREEMPTED_EXIT_CODE
from trainpipe_trainer.processes import die_with_parent

# The options of a one-process, one-node launch (as trainpipe.plan.launch writes them, or spelt with
# dashes); anything else goes to torchrun.
_SINGLE_PROCESS_OPTIONS = frozenset({"--standalone", "--nnodes=1", "--nnodes=1:1", "--nproc_per_node=1",
                                     "--nproc-per-node=1"})
# The signals torchrun's agent passes on to its workers (then exits with 128 + the signal, or "preempted").
_PASSED_ON = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)


def single_process_command(argv: list[str]) -> list[str] | None:
    """The rank's own command when ``argv`` launches one process on one node (torchrun's ``-m module
    args...``), else None."""
    if "-m" not in argv:
        return None
    split = argv.index("-m")
    options, program = argv[:split], argv[split + 1:]
    if not program or "--standalone" not in options or not set(options) <= _SINGLE_PROCESS_OPTIONS:
        return None
    # -u: unbuffered, as torchrun starts its workers (the launcher streams their lines as they come).
    return [sys.executable, "-u", "-m", *program]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def run_single_process(command: list[str]) -> int:
    """Run the one rank as torchrun's agent would, without the agent."""
    env = {
        **os.environ,
        # What torchrun --standalone sets for its only worker (the rank rendezvous through MASTER_*).
        "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": "0",
        "GROUP_WORLD_SIZE": "1", "ROLE_RANK": "0", "ROLE_WORLD_SIZE": "1", "ROLE_NAME": "default",
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": "0", "TORCHELASTIC_RUN_ID": "none",
    }
    received: list[int] = []
    rank: subprocess.Popen | None = None

    def pass_on(signum: int, _frame: FrameType | None) -> None:
        received.append(signum)
        if rank is not None and rank.poll() is None:
            rank.send_signal(signum)

    # Installed first: a signal that comes while the rank starts is passed on once it exists.
    for sig in _PASSED_ON:
        signal.signal(sig, pass_on)
    rank = subprocess.Popen(command, env=env, preexec_fn=die_with_parent(signal.SIGTERM))
    if received:
        rank.send_signal(received[0])
    deadline: float | None = None
    while True:
        try:
            code = rank.wait(timeout=0.5 if deadline is None else max(deadline - time.monotonic(), 0.01))
            break
        except subprocess.TimeoutExpired:
            if deadline is None and received:
                deadline = time.monotonic() + float(os.environ.get(SHUTDOWN_TIMEOUT_ENV, "30"))
            elif deadline is not None and time.monotonic() >= deadline:
                rank.kill()
    if received:
        return _stopped_by(signal.Signals(received[0]))
    if code == 0:
        return 0
    outcome = _outcome({code})
    if outcome != PREEMPTED_EXIT_CODE:
        # What torchrun reports for a failed worker (which rank, its exit code or signal).
        how = f"Signal {-code} ({signal.Signals(-code).name}) received by PID {rank.pid}" if code < 0 else ""
        print(f"trainpipe_trainer FAILED: rank 0 (local_rank: 0) exitcode: {code} (pid: {rank.pid}) {how}".rstrip(),
              file=sys.stderr, flush=True)
    return outcome


def _stopped_by(sig: signal.Signals) -> int:
    """The exit code of a launch that was sent ``sig`` (its workers were passed it and given the grace)."""
    if sig == signal.SIGTERM:
        print(f"torchrun: stopped on {sig.name}; its workers were given "
              f"{SHUTDOWN_TIMEOUT_ENV} to commit their step", file=sys.stderr, flush=True)
        return PREEMPTED_EXIT_CODE
    return 128 + int(sig)


def _outcome(codes: set[int]) -> int:
    """The exit code of a launch whose workers failed with ``codes`` (minus the signal for a killed one)."""
    # The first rank to exit preempted (or out of CUDA memory) makes torchrun SIGTERM the others, which may
    # still be tearing down after the same commit (every rank passed the barrier after the save before any
    # exited). A CUDA OOM is passed on as its own outcome, so the provider can tell it from a crash.
    for passed_on in (PREEMPTED_EXIT_CODE, CUDA_OOM_EXIT_CODE):
        if passed_on in codes and codes <= {passed_on, -signal.SIGTERM}:
            return passed_on
    # torchrun exits 1 for any other failed worker.
    return 1


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    single = single_process_command(args)
    if single is not None:
        return run_single_process(single)
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun

    try:
        torchrun(args)
    except SignalException as err:
        # torchrun already waited for its workers (they commit on the SIGTERM it passed on).
        return _stopped_by(signal.Signals(err.sigval))
    except ChildFailedError as err:
        outcome = _outcome({failure.exitcode for failure in err.failures.values()})
        if outcome != PREEMPTED_EXIT_CODE:
            # What torchrun prints for a failure (which rank, its exit code or signal, when).
            print(err.format_msg(), file=sys.stderr, flush=True)
        return outcome
    return 0


if __name__ == "__main__":
    write_whole_lines()
    sys.exit(main())
