"""The agent's kept connection over https checks what urllib checked: a certificate from a CA
the node trusts, for the very host it calls. A server of the test's own (TLS, HTTP/1.1 kept
alive, answers signed with the agent's key) and a CA made here, trusted through SSL_CERT_FILE
as a node's system store would trust it."""

from __future__ import annotations

import datetime
import json
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from node import activate_agent

KEY = "k" * 43


def certificate(
    subject: str, issuer_key: ec.EllipticCurvePrivateKey | None, issuer: str, *, ca: bool
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if not ca:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False
        )
    return key, builder.sign(issuer_key or key, hashes.SHA256())


@dataclass
class TlsServer:
    port: int
    ca_file: Path
    connections: int = 0
    requests: int = 0


@pytest.fixture
def tls_server(tmp_path: Path) -> Iterator[TlsServer]:
    ca_key, ca = certificate("test CA", None, "test CA", ca=True)
    key, cert = certificate("localhost", ca_key, "test CA", ca=False)
    ca_file, cert_file, key_file = tmp_path / "ca.pem", tmp_path / "cert.pem", tmp_path / "key.pem"
    ca_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert_file, key_file)
    state = TlsServer(port=0, ca_file=ca_file)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # kept alive

        def setup(self) -> None:
            state.connections += 1
            super().setup()

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            state.requests += 1
            nonce = self.headers["Authorization"].split("nonce=")[1].split(",")[0]
            body = json.dumps({"status": "ok", "heartbeat_interval": 30}).encode()
            self.send_response(200)
            sig = activate_agent.answer_signature(KEY, 200, nonce, body)
            self.send_header(activate_agent.SIGNATURE_HEADER, sig)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
    state.port = httpd.server_address[1]
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield state
    httpd.shutdown()
    httpd.server_close()


def agent_for(url: str) -> activate_agent.Agent:
    platform = activate_agent.Platform(url, "wabc", "key1key1key1key1", KEY, timeout=5)
    identity = {"worker": "wabc", "hostname": "n1", "job_id": "1"}
    return activate_agent.Agent(platform, identity, interval=30.0)


def beat(agent: activate_agent.Agent) -> bool:
    return agent.call("/agent/v1/heartbeat", {"worker": "wabc"}) is not None


def test_over_https_the_agents_beats_share_one_verified_connection(
    tls_server: TlsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SSL_CERT_FILE", str(tls_server.ca_file))
    agent = agent_for(f"https://localhost:{tls_server.port}")
    assert [beat(agent) for _ in range(5)] == [True] * 5
    assert (tls_server.connections, tls_server.requests) == (1, 5)


def test_a_certificate_from_a_ca_the_node_does_not_trust_is_refused(
    tls_server: TlsServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    other_ca = certificate("another CA", None, "another CA", ca=True)[1]
    (tmp_path / "other.pem").write_bytes(other_ca.public_bytes(serialization.Encoding.PEM))
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "other.pem"))
    agent = agent_for(f"https://localhost:{tls_server.port}")
    assert not beat(agent)
    assert tls_server.requests == 0


def test_a_certificate_for_another_name_is_refused(
    tls_server: TlsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The certificate names localhost; the agent calls the address.
    monkeypatch.setenv("SSL_CERT_FILE", str(tls_server.ca_file))
    agent = agent_for(f"https://127.0.0.1:{tls_server.port}")
    assert not beat(agent)
    assert tls_server.requests == 0
