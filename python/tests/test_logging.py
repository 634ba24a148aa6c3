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


def test_records_go_to_their_parts_child_logger_with_their_own_time_and_place(caplog):
    import time

    parts = {
        "fetchahead::store::uring": "fetchahead.store",
        "fetchahead::prefetch::prefetcher": "fetchahead.prefetch",
        "fetchahead::l2_plan::device": "fetchahead.l2_plan",
        "fetchahead::kernels::launch": "fetchahead.kernels",
        "fetchahead::driver::launch": "fetchahead.kernels",
        "fetchahead_python": "fetchahead",
    }
    with caplog.at_level(logging.DEBUG, logger="fetchahead"):
        for target in parts:
            before = time.time()
            # Logged, then 200 ms before it is forwarded: the record keeps the first time.
            fetchahead._native._log_example(
                "warn", f"fetchahead: from {target}", target=target, delay_ms=200
            )
            got = [r for r in caplog.records if r.rust_target == target]
            assert len(got) == 1, target
            r = got[0]
            assert r.name == parts[target]
            # No doubled prefix: the logger's name says fetchahead already.
            assert r.getMessage() == f"from {target}"
            assert r.pathname.endswith(".rs") and r.lineno > 0, (r.pathname, r.lineno)
            assert before - 0.01 <= r.created <= before + 0.15, (r.created - before)
