"""sock_diag against the kernel itself: a socket this test opens must be seen with
the same port, state and inode as the /proc/net/tcp text reports."""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time

from aivitals.collect import HostCollector, ProcessCollector
from aivitals.collect._procfs import parse_listen_queues, parse_tcp_table
from aivitals.collect._sockdiag import listen_queues, same_netns, tcp_sockets


def test_netlink_sees_a_listening_and_an_established_socket() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port)) as client:
            accepted, _ = server.accept()
            with accepted:
                rows = [r for r in tcp_sockets() if r[0] == port]
                states = sorted(state for _, state, _ in rows)
                assert states == [1, 10]  # established (accepted side), listen
                assert (port, 10, os.fstat(server.fileno()).st_ino) in rows
                with open("/proc/net/tcp") as f:
                    text = parse_tcp_table(f.read(), frozenset([port]))
                assert text == {(port, "listen"): 1, (port, "established"): 1}
                host = HostCollector(ports=[port])
                got = {
                    s.labels["state"]: s.value
                    for s in host.collect()
                    if s.name == "host_tcp_connections"
                }
                assert got["listen"] == 1 and got["established"] == 1
                assert client.fileno() > 0


def test_process_connections_through_netlink() -> None:
    assert same_netns(os.getpid())
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        samples = list(ProcessCollector(pid=os.getpid()).collect())
        listen = [
            s.value
            for s in samples
            if s.name == "service_process_connections" and s.labels["state"] == "listen"
        ]
        assert listen[0] >= 1


def test_the_accept_queue_of_a_socket_nobody_accepts_from() -> None:
    """Three clients finish the handshake on a socket whose owner never calls accept():
    the kernel holds them in the accept queue, which netlink, the /proc text and the
    process collector report alike, with the backlog the socket was given."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        port = server.getsockname()[1]
        assert listen_queues()[port] == (0, 8)
        clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(3)]
        try:
            assert listen_queues()[port] == (3, 8)
            with open("/proc/net/tcp") as f:
                assert parse_listen_queues(f.read())[port] == 3
            samples = {
                s.name: (s.labels, s.value)
                for s in ProcessCollector(port=port).collect()
                if s.name.startswith("service_listen_queue")
            }
            assert samples == {
                "service_listen_queue_length": ({"port": str(port)}, 3.0),
                "service_listen_queue_limit": ({"port": str(port)}, 8.0),
            }
            accepted, _ = server.accept()
            accepted.close()
            assert listen_queues()[port] == (2, 8)
        finally:
            for c in clients:
                c.close()


def test_a_blocked_event_loop_leaves_new_connections_in_the_accept_queue() -> None:
    """An asyncio server accepts as soon as its loop runs. While a handler blocks the loop
    (a synchronous sleep or IO), new connections wait in the kernel's accept queue
    (``service_listen_queue_length``); the loop drains it once it runs again."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    loop = asyncio.new_event_loop()
    server = loop.run_until_complete(asyncio.start_server(handle, "127.0.0.1", 0))
    port = server.sockets[0].getsockname()[1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    blocked, release = threading.Event(), threading.Event()

    def block() -> None:
        blocked.set()
        release.wait(10)

    clients: list[socket.socket] = []
    try:
        loop.call_soon_threadsafe(block)
        assert blocked.wait(5)
        clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(5)]
        assert listen_queues()[port][0] == 5
        release.set()
        deadline = time.monotonic() + 5
        while listen_queues()[port][0] and time.monotonic() < deadline:
            time.sleep(0.01)
        assert listen_queues()[port][0] == 0
    finally:
        release.set()
        for c in clients:
            c.close()
        loop.call_soon_threadsafe(server.close)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()
