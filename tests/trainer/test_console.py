"""Every rank and torchrun write to one pipe: a line the launcher looks for must never be split by another
process's line (``print`` under ``PYTHONUNBUFFERED`` writes the text and its newline in two calls)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from trainpipe_trainer.outcomes import preempted_message

# Both writers say "ready" on stderr, then start together when told (a line on stdin) and write for a while.
_READY_SET_GO = """
import sys, time
def ready_set_go():
    print("ready", file=sys.stderr, flush=True)
    sys.stdin.readline()
    return time.monotonic() + 0.5
"""
# The entry point runs as torchrun runs it (``-m``, as __main__) and exits early on its arguments; the same
# process then prints the trainer's preemption line.
_TRAINER = _READY_SET_GO + """
import runpy
from trainpipe_trainer.outcomes import preempted_message
module = sys.argv[1]
sys.argv = [module, *sys.argv[2:]]
try:
    runpy.run_module(module, run_name="__main__", alter_sys=True)
except SystemExit:
    pass
end = ready_set_go()
while time.monotonic() < end:
    print(preempted_message("SIGTERM", 12), flush=True)
"""
# torchrun's own lines come from logging (one write per record).
_TORCHRUN = _READY_SET_GO + """
import logging
logging.basicConfig(format="[W] %(message)s", stream=sys.stdout)
end = ready_set_go()
while time.monotonic() < end:
    logging.warning("Sending process 25161 closing signal SIGTERM")
"""
_THEIRS = "[W] Sending process 25161 closing signal SIGTERM"


@pytest.mark.parametrize(("module", "early_exit_args"), [
    ("trainpipe_trainer", ["--config", "/nonexistent/config.json"]),
    ("trainpipe_trainer.elastic", ["--help"]),
])
def test_the_trainers_lines_stay_whole_when_another_process_writes_to_the_same_pipe(
    module: str, early_exit_args: list[str]
) -> None:
    read_end, write_end = os.pipe()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    writers = [
        subprocess.Popen([sys.executable, "-c", code, *args], stdin=subprocess.PIPE, stdout=write_end,
                         stderr=subprocess.PIPE, text=True, env=env)
        for code, args in ((_TRAINER, [module, *early_exit_args]), (_TORCHRUN, []))
    ]
    os.close(write_end)
    for writer in writers:
        # The trainer's entry point says why it exited first (a line on stderr).
        assert "ready\n" in iter(writer.stderr.readline, "")
    for writer in writers:
        writer.stdin.write("go\n")
        writer.stdin.flush()
    with os.fdopen(read_end) as pipe:
        lines = pipe.read().splitlines()
    assert [writer.wait(timeout=60) for writer in writers] == [0, 0]
    ours = preempted_message("SIGTERM", 12)
    assert ours in lines and _THEIRS in lines
    # The usage text of --help comes first; from the first of the two lines on, nothing else may appear.
    window = lines[min(lines.index(ours), lines.index(_THEIRS)):]
    split = [line for line in window if line not in (ours, _THEIRS)]
    assert not split, f"{len(split)} of {len(window)} lines were split, e.g. {split[:2]}"
