"""The pip settings of this machine as uv arguments: `make install` installs with uv (about a minute, against
five with pip), and uv reads no pip.conf. Prints the indexes, find-links and constraint files pip would use."""

from __future__ import annotations

import shlex
import subprocess
import sys

# pip's option -> uv's; pip's global.* and :env:.* (PIP_* variables) both count, as they do for pip.
OPTIONS = {"index-url": "--index-url", "extra-index-url": "--extra-index-url", "find-links": "--find-links",
           "constraint": "--constraint"}


def main() -> int:
    listing = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
    arguments: list[str] = []
    for line in listing.splitlines():
        key, _, raw = line.partition("=")
        option = OPTIONS.get(key.rpartition(".")[2])
        if option is None:
            continue
        for value in shlex.split(raw.strip().strip("'\"")):
            if value not in arguments:  # pip's global and :env: scopes may name the same value
                arguments += [option, value]
    # pip takes each package's best version from all its indexes; uv's default takes the first index that has it.
    if any(option in arguments for option in ("--extra-index-url", "--find-links")):
        arguments += ["--index-strategy", "unsafe-best-match"]
    print(shlex.join(arguments))
    return 0


if __name__ == "__main__":
    sys.exit(main())
