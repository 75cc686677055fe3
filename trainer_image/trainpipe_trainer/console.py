"""Whole lines on the trainer's stdout and stderr."""

from __future__ import annotations

import sys


def write_whole_lines() -> None:
    """Make every line reach stdout and stderr in one write.

    Every rank and torchrun share one pipe. Under ``PYTHONUNBUFFERED`` (which the launch sets so that lines
    stream) ``print`` writes the text and its newline in two calls, and another process's line can land
    between them, which splits a line the launcher and its users look for. Line buffering keeps the
    streaming and writes each line at once (one write of up to PIPE_BUF bytes is never interleaved)."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(line_buffering=True, write_through=False)
