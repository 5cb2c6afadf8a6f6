"""A real TCP proxy for tests: put it between a client and a server to count, cut or refuse.

:class:`TcpProxy` listens on 127.0.0.1 (an ephemeral port) and forwards every connection
it accepts to one target, full duplex, with two threads per connection (one per
direction) and 256 KiB reads, so gRPC's HTTP/2 streams pass through unchanged. A test can

* count the bytes forwarded each way (:attr:`TcpProxy.bytes_down`, :attr:`TcpProxy.bytes_up`;
  a chunk is counted as it is handed on, so a receiver that has it sees it counted),
* drop every open connection as a broken network would (:meth:`TcpProxy.cut`): both sides
  see a reset, new connections are still accepted,
* stand for a server that is gone (:meth:`TcpProxy.pause`): existing connections are cut and
  new ones reset as soon as they are accepted, until :meth:`TcpProxy.resume`.

Only the stdlib. A connection's sockets are closed by its own threads, never by another:
:meth:`TcpProxy.cut` shuts them down (which wakes a thread blocked in ``recv``) with
``SO_LINGER`` 0, so the close that follows sends a reset.
"""

from __future__ import annotations

import socket
import struct
import threading
from types import TracebackType

__all__ = ["TcpProxy"]

READ_BYTES = 256 << 10
_RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends RST, not FIN


def _abort(sock: socket.socket) -> None:
    """Make ``sock``'s close a reset and wake any thread blocked on it (never closes it)."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET)
    except OSError:
        pass  # already closed by its threads
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # not connected any more


class _Pipe:
    """One proxied connection: the client's socket, the target's, a thread per direction."""

    def __init__(self, proxy: TcpProxy, client: socket.socket, target: socket.socket) -> None:
        self.proxy = proxy
        self.client = client
        self.target = target
        self._left = 2  # directions still pumping; the last one closes both sockets
        self._lock = threading.Lock()
        self.threads = [
            threading.Thread(target=self._pump, args=(client, target, True), daemon=True,
                             name="tcpproxy-up"),
            threading.Thread(target=self._pump, args=(target, client, False), daemon=True,
                             name="tcpproxy-down"),
        ]

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def cut(self) -> None:
        _abort(self.client)
        _abort(self.target)

    def _pump(self, src: socket.socket, dst: socket.socket, up: bool) -> None:
        buf = bytearray(READ_BYTES)
        view = memoryview(buf)
        try:
            while True:
                n = src.recv_into(buf)
                if n == 0:  # the sender finished: pass the half-close on
                    dst.shutdown(socket.SHUT_WR)
                    break
                self.proxy._count(n, up)  # first: whoever receives them sees them counted
                dst.sendall(view[:n])
        except OSError:  # reset, cut, or the other direction closed: drop the connection
            self.cut()
        finally:
            view.release()
            with self._lock:
                self._left -= 1
                last = self._left == 0
            if last:
                self.client.close()
                self.target.close()
                self.proxy._forget(self)


class TcpProxy:
    """A TCP proxy from 127.0.0.1 (an ephemeral port) to ``target_host:target_port``.

    Thread-safe: :meth:`cut`, :meth:`pause`, :meth:`resume` and the counters may be used
    from any thread while connections are being forwarded.

    Parameters
    ----------
    target_host, target_port
        Where every accepted connection is forwarded. A connection the target refuses is
        reset at once.

    Examples
    --------
    >>> with TcpProxy("127.0.0.1", server.port) as proxy:        # doctest: +SKIP
    ...     client = tt.connect(f"grpc://127.0.0.1:{proxy.port}")
    ...     proxy.cut()                   # every open connection drops
    """

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, int(target_port))
        self._lock = threading.Lock()  # the pipes, the counters, the paused flag
        self._pipes: set[_Pipe] = set()
        self._up = 0
        self._down = 0
        self._paused = False
        self._closed = False
        self._listener: socket.socket | None = None
        self._acceptor: threading.Thread | None = None
        self._port: int | None = None

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> int:
        """Listen and forward in the background; returns the listening port.

        Raises
        ------
        RuntimeError
            If the proxy was started or closed before.
        """
        if self._listener is not None or self._closed:
            raise RuntimeError("a TcpProxy starts once; make a new one")
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        self._listener = listener
        self._port = listener.getsockname()[1]
        self._acceptor = threading.Thread(target=self._accept, daemon=True,
                                          name=f"tcpproxy-accept-{self._port}")
        self._acceptor.start()
        return self._port

    @property
    def port(self) -> int:
        """The listening port on 127.0.0.1."""
        if self._port is None:
            raise RuntimeError("the proxy is not started: call start() first")
        return self._port

    def close(self) -> None:
        """Stop listening and cut every connection; waits for the proxy's threads."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            pipes = list(self._pipes)
        if self._listener is not None:
            _abort(self._listener)  # wakes accept()
            if self._acceptor is not None:
                self._acceptor.join(10)
            self._listener.close()
        for pipe in pipes:
            pipe.cut()
        for pipe in pipes:
            for thread in pipe.threads:
                thread.join(10)

    def __enter__(self) -> TcpProxy:
        if self._listener is None:
            self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "paused" if self._paused else "open"
        return (f"<TcpProxy 127.0.0.1:{self._port} -> {self.target[0]}:{self.target[1]} "
                f"{state} connections={self.connections}>")

    # ------------------------------------------------------------------ faults
    def cut(self) -> None:
        """Drop every open connection, both sides, with a reset; new ones are accepted."""
        with self._lock:
            pipes = list(self._pipes)
        for pipe in pipes:
            pipe.cut()

    def pause(self) -> None:
        """Cut every open connection and reset new ones as soon as they are accepted."""
        with self._lock:
            self._paused = True
        self.cut()

    def resume(self) -> None:
        """Forward new connections again (after :meth:`pause`)."""
        with self._lock:
            self._paused = False

    # ------------------------------------------------------------------ counters
    @property
    def bytes_down(self) -> int:
        """Bytes forwarded from the target to clients since start (or :meth:`reset_counts`)."""
        with self._lock:
            return self._down

    @property
    def bytes_up(self) -> int:
        """Bytes forwarded from clients to the target since start (or :meth:`reset_counts`)."""
        with self._lock:
            return self._up

    @property
    def connections(self) -> int:
        """Connections open now."""
        with self._lock:
            return len(self._pipes)

    def reset_counts(self) -> None:
        """Set :attr:`bytes_down` and :attr:`bytes_up` to 0."""
        with self._lock:
            self._up = self._down = 0

    def _count(self, n: int, up: bool) -> None:
        with self._lock:
            if up:
                self._up += n
            else:
                self._down += n

    # ------------------------------------------------------------------ the threads
    def _accept(self) -> None:
        assert self._listener is not None
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:  # closed
                return
            with self._lock:
                refuse = self._paused or self._closed
            if refuse:
                _abort(conn)
                conn.close()
                continue
            try:
                target = socket.create_connection(self.target, timeout=10)
            except OSError:  # the target is down: so is this connection
                _abort(conn)
                conn.close()
                continue
            target.settimeout(None)
            for sock in (conn, target):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            pipe = _Pipe(self, conn, target)
            with self._lock:
                refuse = self._paused or self._closed  # paused while connecting
                if not refuse:
                    self._pipes.add(pipe)
            if refuse:
                for sock in (conn, target):
                    _abort(sock)
                    sock.close()
                continue
            pipe.start()

    def _forget(self, pipe: _Pipe) -> None:
        with self._lock:
            self._pipes.discard(pipe)
