"""``python -m fetchahead`` and the wheel's ``fetchahead`` command: the product's own binary (the
``fetchahead`` that ``cargo build --features cli`` makes), shipped in the package as
``fetchahead/_bin/fetchahead`` and run with this process's arguments. The extension module that
engines import links none of the command line's crates."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Optional, Sequence

COMMAND = Path(__file__).resolve().parent / "_bin" / "fetchahead"


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Runs ``fetchahead`` with ``argv`` and returns its exit status. Without ``argv`` (the console
    script, ``python -m fetchahead``) this process becomes the command, with its own arguments, so
    that signals and the exit status are the binary's."""
    if not COMMAND.is_file():
        print(
            f"fetchahead: this install has no command line ({COMMAND} is missing): it was built "
            "without the `command` feature that the wheel's build turns on. Install a wheel, or "
            "run `cargo run --release -p fetchahead --features cli --bin fetchahead -- ...` in "
            "the repository.",
            file=sys.stderr,
        )
        return 2
    if argv is None:
        sys.stdout.flush()
        sys.stderr.flush()
        os.execv(COMMAND, ["fetchahead", *sys.argv[1:]])
    return subprocess.run([str(COMMAND), *argv]).returncode


if __name__ == "__main__":
    sys.exit(main())
