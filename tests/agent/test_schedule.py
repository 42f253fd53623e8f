from __future__ import annotations

import threading
import time

from aivitals.agent._schedule import Job

from .conftest import wait_for


def test_runs_on_a_drift_free_grid() -> None:
    stamps: list[float] = []

    def work(now: float) -> None:
        stamps.append(time.monotonic())
        time.sleep(0.02)  # each run takes time; the grid must not slide by it

    stop = threading.Event()
    job = Job("grid", 0.1, work)
    job.start(stop)
    try:
        wait_for(lambda: len(stamps) >= 11)
    finally:
        stop.set()
        job.join(2)
    # Ten periods later the job is ten intervals on, not ten (interval + work) on.
    elapsed = stamps[10] - stamps[0]
    assert 0.95 <= elapsed < 1.15, elapsed


def test_overrun_skips_missed_slots_and_counts_them() -> None:
    calls: list[float] = []

    def slow_first(now: float) -> None:
        calls.append(time.monotonic())
        if len(calls) == 1:
            time.sleep(0.35)

    stop = threading.Event()
    job = Job("slow", 0.1, slow_first)
    job.start(stop)
    try:
        wait_for(lambda: len(calls) >= 3)
    finally:
        stop.set()
        job.join(2)
    assert job.missed >= 3
    assert calls[1] - calls[0] >= 0.35  # no burst of late runs


def test_a_raising_job_keeps_its_schedule() -> None:
    calls: list[float] = []

    def broken(now: float) -> None:
        calls.append(now)
        raise RuntimeError("bug")

    stop = threading.Event()
    job = Job("broken", 0.05, broken)
    job.start(stop)
    try:
        wait_for(lambda: len(calls) >= 3)
    finally:
        stop.set()
        job.join(2)
    assert job.failures >= 3
