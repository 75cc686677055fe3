"""Import probes in one child process: ``probe(code)`` runs Python code as ``python -c`` would, in a fresh child.

A test that asks "what does importing X pull in?" needs an interpreter that has imported nothing yet; starting one
per probe cost a Python start each. Instead, one server per test process (started on the first probe, its only
imports the standard library's) forks a child per probe: the child starts from the server's near-empty state, runs
the code with its own environment, working folder, argv and stdin, and its stdout, stderr and exit status come back.
"""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys
import threading
from typing import Any

_SERVER = r'''
import json, os, signal, sys, tempfile, time, traceback

def run(request):
    out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
    stdin = tempfile.TemporaryFile()
    stdin.write(request["stdin"].encode()); stdin.seek(0)
    pid = os.fork()
    if pid == 0:
        status = 0
        try:
            os.setsid()  # its own group: a timeout kills whatever it started too
            os.dup2(stdin.fileno(), 0); os.dup2(out.fileno(), 1); os.dup2(err.fileno(), 2)
            sys.stdin = open(0, closefd=False)
            sys.stdout = open(1, "w", closefd=False)
            sys.stderr = open(2, "w", closefd=False)
            os.environ.clear(); os.environ.update(request["env"])
            if request["cwd"]:
                os.chdir(request["cwd"])
            sys.argv = ["-c", *request["args"]]
            sys.path[0] = ""  # as `python -c`: the working folder first
            exec(compile(request["code"], "<string>", "exec"), {"__name__": "__main__"})
        except SystemExit as stop:
            status = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
            if not isinstance(stop.code, int) and stop.code is not None:
                print(stop.code, file=sys.stderr)
        except BaseException:
            traceback.print_exc()
            status = 1
        finally:
            try:
                sys.stdout.flush(); sys.stderr.flush()
            finally:
                os._exit(status)
    deadline = time.monotonic() + request["timeout"]
    timed_out = False
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            timed_out = True
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            os.waitpid(pid, 0)
            break
        time.sleep(0.01)
    out.seek(0); err.seek(0)
    code = -9 if timed_out else (os.waitstatus_to_exitcode(status))
    return {"returncode": code, "stdout": out.read().decode(errors="replace"),
            "stderr": err.read().decode(errors="replace"), "timed_out": timed_out}

for line in sys.stdin:
    answer = run(json.loads(line))
    sys.stdout.write(json.dumps(answer) + "\n")
    sys.stdout.flush()
'''


class ProbeTimeout(subprocess.TimeoutExpired):
    pass


class _ProbeServer:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._process: subprocess.Popen[str] | None = None

    def _server(self) -> subprocess.Popen[str]:
        if self._process is None or self._process.poll() is not None:
            # -S would skip site-packages (the probes import installed packages); -I is not wanted either
            # (PYTHONPATH must reach the child). The server itself imports nothing beyond the standard library.
            self._process = subprocess.Popen([sys.executable, "-c", _SERVER], stdin=subprocess.PIPE,
                                             stdout=subprocess.PIPE, text=True, env=os.environ.copy())
            atexit.register(self.close)
        return self._process

    def run(self, code: str, *args: str, env: dict[str, str] | None = None, cwd: str | os.PathLike | None = None,
            input: str = "", timeout: float = 120, check: bool = False) -> subprocess.CompletedProcess[str]:
        # As subprocess does: without env, the test process's environment as it is now.
        request = {"code": code, "args": [str(arg) for arg in args], "env": dict(os.environ if env is None else env),
                   "cwd": None if cwd is None else str(cwd), "stdin": input, "timeout": timeout}
        with self._lock:
            server = self._server()
            assert server.stdin is not None and server.stdout is not None
            server.stdin.write(json.dumps(request) + "\n")
            server.stdin.flush()
            answer: dict[str, Any] = json.loads(server.stdout.readline())
        argv = [sys.executable, "-c", code, *request["args"]]
        if answer["timed_out"]:
            raise ProbeTimeout(argv, timeout, answer["stdout"], answer["stderr"])
        result = subprocess.CompletedProcess(argv, answer["returncode"], answer["stdout"], answer["stderr"])
        if check:
            result.check_returncode()
        return result

    def close(self) -> None:
        if self._process is not None and self._process.poll() is None:
            assert self._process.stdin is not None
            self._process.stdin.close()
            self._process.wait(timeout=30)


_probes = _ProbeServer()
probe = _probes.run
