"""``python -m fetchahead`` and the wheel's ``fetchahead`` command: the Rust CLI itself
(``fetchahead::cli::main``, the binary's own code), run with this process's arguments."""
from __future__ import annotations

import signal
import sys
from typing import Optional, Sequence


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Runs ``fetchahead`` with ``argv`` (default: this process's arguments after the program
    name) and returns its exit status."""
    from . import _native

    args = list(sys.argv[1:] if argv is None else argv)
    # The command runs without the GIL: Ctrl-C ends it as it ends the binary.
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
    sys.stdout.flush()
    return _native.cli_main(["fetchahead", *args])


if __name__ == "__main__":
    sys.exit(main())
