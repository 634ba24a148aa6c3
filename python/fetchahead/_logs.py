"""Log records from fetchahead's Rust code, made into ``logging`` records.

Each goes to the child logger of the part it came from (``fetchahead.store``,
``fetchahead.prefetch``, ``fetchahead.l2_plan``, ``fetchahead.kernels``, else ``fetchahead``)
with the time it happened (``record.created``, not when it was forwarded) and its Rust file and
line as ``pathname`` / ``lineno``; ``record.rust_target`` is its Rust module path. The logger's
name already says it is fetchahead's, so a message's leading ``"fetchahead: "`` is dropped.
"""
from __future__ import annotations

import logging
import os
import time

_PREFIX = "fetchahead: "


def forward(records: list) -> None:
    """Hands ``[(level, logger, message, file, line, created, target), ...]`` to ``logging``."""
    now = time.time()
    for level, name, message, file, line, created, target in records:
        logger = logging.getLogger(name)
        if not logger.isEnabledFor(level):
            continue
        if message.startswith(_PREFIX):
            message = message[len(_PREFIX) :]
        record = logger.makeRecord(
            name,
            level,
            file,
            line,
            "%s",
            (message,),
            None,
            func=None,
            extra={"rust_target": target},
        )
        record.module = os.path.splitext(os.path.basename(file))[0]
        # The event's own time: makeRecord stamped it now.
        early = now - created
        record.created = created
        record.msecs = (created - int(created)) * 1000.0
        record.relativeCreated -= early * 1000.0
        logger.handle(record)
