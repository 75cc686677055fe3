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
"""

from __future__ import annotations

import signal
import sys

from trainpipe_trainer.console import write_whole_lines
from trainpipe_trainer.outcomes import CUDA_OOM_EXIT_CODE, PREEMPTED_EXIT_CODE


def main(argv: list[str] | None = None) -> int:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun

    try:
        torchrun(sys.argv[1:] if argv is None else argv)
    except SignalException as err:
        # torchrun already waited for its workers (they commit on the SIGTERM it passed on).
        if err.sigval == signal.SIGTERM:
            print(f"torchrun: stopped on {err.sigval.name}; its workers were given "
                  "TORCH_ELASTIC_SHUTDOWN_TIMEOUT to commit their step", file=sys.stderr, flush=True)
            return PREEMPTED_EXIT_CODE
        return 128 + int(err.sigval)
    except ChildFailedError as err:
        codes = {failure.exitcode for failure in err.failures.values()}
        # The first rank to exit preempted makes torchrun SIGTERM the others, which may still be tearing
        # down after the same commit (every rank passed the barrier after the save before any exited).
        if PREEMPTED_EXIT_CODE in codes and codes <= {PREEMPTED_EXIT_CODE, -signal.SIGTERM}:
            return PREEMPTED_EXIT_CODE
        # torchrun exits 1 for any failed worker: a rank's CUDA OOM is passed on as its own outcome (the others
        # were SIGTERMed by torchrun), so the provider can tell it from a crash.
        if CUDA_OOM_EXIT_CODE in codes and codes <= {CUDA_OOM_EXIT_CODE, -signal.SIGTERM}:
            print(err.format_msg(), file=sys.stderr, flush=True)
            return CUDA_OOM_EXIT_CODE
        # What torchrun prints for a failure (which rank, its exit code or signal, when).
        print(err.format_msg(), file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    write_whole_lines()
    sys.exit(main())
