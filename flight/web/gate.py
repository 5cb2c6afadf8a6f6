"""The web UI's token gate: the same tokens as Flight (:mod:`flight.rpc.auth`), for a browser.

A browser cannot put an ``authorization`` header on a WebSocket, so the page asks for the
token once (the login page), posts it to ``/api/login`` and from then on every HTTP and
WebSocket call carries a session cookie derived from it: ``HMAC-SHA256(token,
"ticktable-web")``, HttpOnly, SameSite=Strict, Secure over TLS. The cookie opens the web
UI only (it is not the token, so it cannot call Flight). Scripts may send ``authorization:
Bearer <token>`` instead. Either token works (the web UI only reads). Without a server
token everything is open. WebSockets also refuse other origins (the cookie would
otherwise let any site open one).
"""

from __future__ import annotations

import hashlib
import hmac

__all__ = ["COOKIE", "Gate"]

#: The session cookie's name.
COOKIE = "ticktable_session"


def _session(token: str) -> str:
    return hmac.new(token.encode(), b"ticktable-web", hashlib.sha256).hexdigest()


class Gate:
    """Checks the credentials of a web request.

    Parameters
    ----------
    token, read_token
        The server's tokens (:class:`flight.server.ServerConfig`); ``token=None``: open.
    """

    def __init__(self, token: str | None, read_token: str | None = None) -> None:
        self._tokens = [t for t in (token, read_token) if t]
        self._sessions = [_session(t) for t in self._tokens]

    @property
    def open(self) -> bool:
        """Whether no token is needed."""
        return not self._tokens

    def session_for(self, token: str) -> str | None:
        """The cookie value for ``token``, or ``None`` when it is not one of the server's."""
        for t, s in zip(self._tokens, self._sessions, strict=True):
            if hmac.compare_digest(token.encode(), t.encode()):
                return s
        return None

    def allows(self, cookie: str | None, authorization: str | None) -> bool:
        """Whether a request with this cookie value and ``authorization`` header may pass."""
        if self.open:
            return True
        if cookie and any(hmac.compare_digest(cookie.encode(), s.encode())
                          for s in self._sessions):
            return True
        if authorization and authorization[:7].lower() == "bearer ":
            return self.session_for(authorization[7:].strip()) is not None
        return False
