"""TLS with a self-signed certificate (made by the openssl CLI), plus the bearer token."""

from __future__ import annotations

import subprocess

import pyarrow as pa
import pyarrow.flight as fl
import pytest

from flight.server import ServerConfig, TicktableServer


@pytest.fixture(scope="module")
def cert(tmp_path_factory):
    d = tmp_path_factory.mktemp("tls")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
                    "-keyout", str(d / "key.pem"), "-out", str(d / "cert.pem")],
                   check=True, capture_output=True)
    return (d / "cert.pem").read_bytes(), (d / "key.pem").read_bytes()


def test_tls_and_token(graph, cert):
    crt, key = cert
    srv = TicktableServer(graph, ServerConfig(token="t0k", tls_cert=crt,
                                              tls_key=key)).start()
    try:
        assert srv.location.startswith("grpc+tls://")
        t = srv.registry.create_source("t", pa.schema([("x", pa.int64())]), "append").table
        t.append(pa.table({"x": [1, 2]}))
        graph.run_cycle()
        auth = fl.FlightCallOptions(headers=[(b"authorization", b"Bearer t0k")])
        c = fl.connect(srv.location, tls_root_certs=crt)
        assert c.do_get(fl.Ticket(b"t"), options=auth).read_all().to_pydict() == {"x": [1, 2]}
        with pytest.raises(fl.FlightUnauthenticatedError):
            c.do_get(fl.Ticket(b"t")).read_all()
        plain = fl.connect(f"grpc://127.0.0.1:{srv.port}")  # no TLS: the call fails
        with pytest.raises(fl.FlightError):
            list(plain.list_flights(options=auth))
        c.close()
    finally:
        srv.shutdown()
