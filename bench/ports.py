"""A port for servers started later, held from the moment it is chosen (Linux).

A port that was free a moment ago (bind to port 0, read it, close) and is used later is a
race: until a server binds it, the kernel may give it to anyone, another process's bind to
port 0 or an outgoing connection's local port, and the server then fails with
``PortInUse``. The same window opens between a server's shutdown and its restart on the
same port. On a machine running several test suites at once it does get taken.

:class:`HeldPort` closes the window: it keeps the port bound by a socket that never
listens, with ``SO_REUSEADDR``. While it is open,

* a connection to the port is refused, as to a port nobody uses (nothing listens);
* the kernel gives the port to nobody else: no bind to port 0, no outgoing connection gets
  it, and a bind without ``SO_REUSEADDR`` fails with ``EADDRINUSE``;
* a server setting ``SO_REUSEADDR`` itself binds and listens on it, again after each
  restart: gRPC (our server turns off ``SO_REUSEPORT``, not ``SO_REUSEADDR``),
  ``socket.create_server`` (the web UI) and tornado (Jupyter) all set it.

That is Linux's rule: sockets with ``SO_REUSEADDR`` share a port unless one of them listens.
"""

from __future__ import annotations

import socket
from types import TracebackType

__all__ = ["HeldPort"]


class HeldPort:
    """A TCP port on 127.0.0.1 that only servers started on it can take (see the module).

    Close it once no server will be started on the port again (a server listening on it
    keeps it: closing earlier is harmless).

    Examples
    --------
    >>> with HeldPort() as held:                                       # doctest: +SKIP
    ...     link = mirror.mirror(f"grpc://127.0.0.1:{held.port}/t")      # refused for now
    ...     origin = TicktableServer(graph, ServerConfig(port=held.port)).start()
    """

    def __init__(self) -> None:
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._sock.bind(("127.0.0.1", 0))
        except BaseException:
            self._sock.close()
            raise
        #: the port held
        self.port: int = self._sock.getsockname()[1]

    def close(self) -> None:
        """Let the port go (once no server will be started on it again)."""
        self._sock.close()

    def __enter__(self) -> HeldPort:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<HeldPort 127.0.0.1:{self.port}{' closed' if self._sock.fileno() < 0 else ''}>"
