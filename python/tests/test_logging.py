"""Rust log records reach logging.getLogger("fetchahead"), from any thread."""
from __future__ import annotations

import logging

import fetchahead


def test_a_record_from_a_rust_thread_reaches_logging(caplog):
    with caplog.at_level(logging.DEBUG, logger="fetchahead"):
        fetchahead._native._log_example("warn", "a warning from a Rust thread")
        fetchahead._native._log_example("info", "an info record")
    records = [(r.name, r.levelno, r.getMessage()) for r in caplog.records]
    assert ("fetchahead", logging.WARNING, "a warning from a Rust thread") in records
    assert ("fetchahead", logging.INFO, "an info record") in records
    assert fetchahead._native.dropped_log_records() == 0


def test_flush_logs_forwards_nothing_when_nothing_is_queued(caplog):
    with caplog.at_level(logging.DEBUG, logger="fetchahead"):
        fetchahead.flush_logs()
    assert not [r for r in caplog.records if r.name == "fetchahead"]


def test_nothing_is_printed_without_a_handler():
    import subprocess
    import sys

    code = "import fetchahead; fetchahead._native._log_example('error', 'an error record')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout == "" and out.stderr == ""
