"""A real S3 endpoint for tests: moto's server on a free 127.0.0.1 port (no side effects on import)."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def moto_s3_server(*, check_credentials: bool = False) -> Iterator[str]:
    """A real S3 endpoint (moto's server) on a free 127.0.0.1 port, stopped afterwards; its URL.

    With ``check_credentials``, the server checks every request's keys (moto's IAM authentication) and,
    having no IAM user, refuses them all: an endpoint that refuses the credentials it is given."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "0"} if check_credentials else None
    server = subprocess.Popen([str(Path(sys.executable).with_name("moto_server")), "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    deadline = time.monotonic() + 30
    try:
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise RuntimeError("moto_server did not start") from None
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait(timeout=10)
