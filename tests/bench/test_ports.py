"""bench/ports.py: a held port refuses connections, is given to nobody else, and takes a
server (and its restart) that binds it."""

from __future__ import annotations

import socket

import pytest

from bench.ports import HeldPort
from engine.errors import PortInUse
from engine.graph import UpdateGraph
from flight.server import ServerConfig, TicktableServer


def _refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    except ConnectionRefusedError:
        return True
    return False


def test_a_held_port_refuses_connections_and_is_bound_by_nobody_else():
    with HeldPort() as held:
        assert _refused(held.port)
        with socket.socket() as other, pytest.raises(OSError, match="in use"):
            other.bind(("127.0.0.1", held.port))
    assert "closed" in repr(held)
    # binds of port 0 draw from ~14k ports: 2000 of them would hit 100 merely freed ports
    # about 14 times (a "free port" helper's race); held ones, never
    helds = [HeldPort() for _ in range(100)]
    try:
        ports = {h.port for h in helds}
        for _ in range(2000):
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                assert s.getsockname()[1] not in ports
    finally:
        for h in helds:
            h.close()


def test_servers_bind_a_held_port_one_after_the_other():
    with HeldPort() as held:
        for _ in range(2):  # a restart on the same port
            server = TicktableServer(UpdateGraph(), ServerConfig(port=held.port,
                                                                 http_port=None)).start()
            try:
                assert server.port == held.port and not _refused(held.port)
                with pytest.raises(PortInUse):  # still one server per port
                    TicktableServer(UpdateGraph(), ServerConfig(port=held.port,
                                                                http_port=None)).start()
            finally:
                server.shutdown()
            assert _refused(held.port)
