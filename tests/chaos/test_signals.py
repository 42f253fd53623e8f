"""``interrupt_on_signals``: what ``aivitals validate`` and ``aivitals demo`` stop on."""

from __future__ import annotations

import os
import signal
import time

import pytest

from aivitals.chaos import interrupt_on_signals


def test_every_stop_signal_raises_keyboard_interrupt_even_when_sigint_was_ignored() -> None:
    """A shell without job control starts background jobs with SIGINT ignored; a command
    under ``interrupt_on_signals`` must still stop on ``kill -INT`` (and on SIGTERM,
    SIGHUP), then restore what it found."""
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            with pytest.raises(KeyboardInterrupt), interrupt_on_signals():
                os.kill(os.getpid(), sig)
                time.sleep(5)  # the handler raises at once; a miss ends the sleep
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN  # restored
    finally:
        signal.signal(signal.SIGINT, before)


def test_handlers_found_on_entry_are_restored_after_a_normal_exit() -> None:
    def mine(signum: int, frame: object) -> None:  # pragma: no cover - never called
        pass

    before = signal.signal(signal.SIGTERM, mine)
    try:
        with interrupt_on_signals():
            assert signal.getsignal(signal.SIGTERM) is not mine
        assert signal.getsignal(signal.SIGTERM) is mine
    finally:
        signal.signal(signal.SIGTERM, before)
