"""A stand-in for the stack's GCS store: Debian's redis-server with TLS only and a password, as ElastiCache for
Valkey runs with transit encryption and an AUTH token. Used by the head-loss case and tests/test_gcs_ft.py."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path


class StoreError(RuntimeError):
    """redis-server is missing or did not listen."""


def certificates(directory: Path, host: str) -> tuple[Path, Path, Path]:
    """A CA, and a certificate for `host` (an IP address) that it signs: (ca, certificate, key)."""
    ca_key, ca, key, csr, cert = (directory / n for n in ("ca.key", "ca.crt", "store.key", "store.csr", "store.crt"))
    san = directory / "san.ext"
    san.write_text(f"subjectAltName=IP:{host}\n")
    days = ["-days", "2"]
    for command in (
        ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", ca_key, "-out", ca, *days, "-subj", "/CN=ca"],
        ["req", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", csr, "-subj", f"/CN={host}"],
        ["x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial", "-out", cert, *days,
         "-extfile", san],
    ):  # fmt: skip
        subprocess.run(["openssl", *map(str, command)], check=True, capture_output=True, timeout=60)
    return ca, cert, key


def listening(host: str, port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex((host, port)) == 0


class TlsRedis:
    """redis-server on host:port, TLS only, this password; `persistent` keeps its data across a restart in an
    append-only file written on every command (a failover's new primary holds what the old one had)."""

    def __init__(self, directory: Path, *, host: str, port: int, password: str, persistent: bool = False) -> None:
        server = shutil.which("redis-server")
        if server is None:
            raise StoreError("redis-server is not installed: `.ci/run` installs Debian's")
        directory.mkdir(parents=True, exist_ok=True)
        self.host, self.port = host, port
        self.ca, cert, key = certificates(directory, host)
        kept = ["--appendonly", "yes", "--appendfsync", "always"] if persistent else ["--appendonly", "no"]
        self.command = [
            server, "--port", "0", "--tls-port", str(port), "--bind", host, "--tls-cert-file", str(cert),
            "--tls-key-file", str(key), "--tls-ca-cert-file", str(self.ca), "--tls-auth-clients", "no",
            "--requirepass", password, "--save", "", *kept, "--dir", str(directory),
        ]  # fmt: skip
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 60.0) -> None:
        self.process = subprocess.Popen(self.command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout_s
        while not listening(self.host, self.port):
            if time.monotonic() > deadline or self.process.poll() is not None:
                raise StoreError(f"redis-server did not listen on {self.host}:{self.port} within {timeout_s:.0f} s")
            time.sleep(0.2)

    def kill(self) -> None:
        """Gone at once, as a failed primary is."""
        if self.process is not None:
            self.process.kill()
            self.process.wait(timeout=30)
            self.process = None


@contextlib.contextmanager
def tls_store(directory: Path, *, host: str, port: int, password: str, persistent: bool = False) -> Iterator[TlsRedis]:
    """A started TlsRedis, killed at the end."""
    store = TlsRedis(directory, host=host, port=port, password=password, persistent=persistent)
    try:
        store.start()
        yield store
    finally:
        store.kill()


@contextlib.contextmanager
def tls_redis(directory: Path, *, host: str, port: int, password: str) -> Iterator[Path]:
    """redis-server on host:port, TLS only, this password, nothing saved; yields the CA that signed its
    certificate (what a client must trust, as the image trusts ElastiCache's issuer)."""
    with tls_store(directory, host=host, port=port, password=password) as store:
        yield store.ca
