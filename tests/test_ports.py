"""Ports picked now for a server bound later: outside the kernel's ephemeral range."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from aivitals import _ports
from aivitals._ports import free_port
from aivitals.fleet import _fleet


def test_a_port_is_free_below_the_ephemeral_range_and_never_handed_twice() -> None:
    start = _ports._ephemeral_start()
    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == 50
    assert all(10_000 <= p < start for p in ports), ports
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports[-1]))  # still free


def test_a_port_in_use_is_not_picked(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        choices = iter([taken, taken + 1 if taken + 1 < 60_000 else taken - 1])
        monkeypatch.setattr(_ports, "_ephemeral_start", lambda: 60_000)
        monkeypatch.setattr(_ports, "_handed", set())

        class _Rng:
            def randrange(self, lo: int, hi: int) -> int:
                return next(choices)

        monkeypatch.setattr(_ports.random, "SystemRandom", _Rng)
        assert free_port() != taken


def test_without_room_below_the_range_the_kernel_chooses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = tmp_path / "ip_local_port_range"
    fake.write_text("10200\t60999\n")
    monkeypatch.setattr(_ports, "_RANGE", fake)
    assert _ports._ephemeral_start() == 10_200
    assert free_port() >= 10_200  # bind(0): the kernel's range
    fake.write_text("garbage")
    assert _ports._ephemeral_start() == 32_768


def test_the_fleet_picks_its_ports_outside_the_ephemeral_range() -> None:
    # it binds them after every node's model has loaded, seconds later
    assert 10_000 <= _fleet._free_port() < _ports._ephemeral_start()
