"""Throwaway TLS material for the transport tests, made with the ``openssl`` CLI: a CA, a server
certificate for localhost and 127.0.0.1, a client certificate from the same CA, and a client
certificate from another CA (which a mutual-TLS server must refuse)."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

OPENSSL_TIMEOUT_S = 30.0
DAYS = "2"


@dataclass(frozen=True)
class Certificates:
    """PEM files: ``ca`` signed ``server_*`` and ``client_*``; ``other_ca`` signed ``other_*``."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path
    other_client_cert: Path
    other_client_key: Path


def openssl_path() -> str | None:
    return shutil.which("openssl")


def _openssl(folder: Path, *args: str) -> None:
    openssl = openssl_path()
    assert openssl is not None
    done = subprocess.run(
        [openssl, *args],
        cwd=folder,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=OPENSSL_TIMEOUT_S,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"openssl {' '.join(args)} failed ({done.returncode}):\n"
            + done.stderr.decode(errors="replace")
        )


# P-256 keys: generated in milliseconds, and every TLS stack takes them.
_NEW_KEY = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")


def _make_ca(folder: Path, name: str, subject: str) -> tuple[Path, Path]:
    _openssl(
        folder,
        "req",
        "-x509",
        *_NEW_KEY,
        "-keyout",
        f"{name}.key",
        "-out",
        f"{name}.pem",
        "-days",
        DAYS,
        "-subj",
        subject,
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
    )
    return folder / f"{name}.pem", folder / f"{name}.key"


def _make_leaf(
    folder: Path,
    name: str,
    subject: str,
    extensions: str,
    ca: tuple[Path, Path],
    serial: int,
) -> tuple[Path, Path]:
    """A certificate signed by ``ca`` with ``extensions`` (an openssl extension file's lines)."""
    (folder / f"{name}.ext").write_text(extensions)
    _openssl(
        folder,
        "req",
        "-new",
        *_NEW_KEY,
        "-keyout",
        f"{name}.key",
        "-out",
        f"{name}.csr",
        "-subj",
        subject,
    )
    _openssl(
        folder,
        "x509",
        "-req",
        "-in",
        f"{name}.csr",
        "-CA",
        str(ca[0]),
        "-CAkey",
        str(ca[1]),
        "-set_serial",
        str(serial),
        "-days",
        DAYS,
        "-extfile",
        f"{name}.ext",
        "-out",
        f"{name}.pem",
    )
    return folder / f"{name}.pem", folder / f"{name}.key"


LEAF = "basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\n"


def make_certificates(folder: Path) -> Certificates:
    """Writes every file under ``folder`` (which must exist). Needs the ``openssl`` CLI."""
    folder = folder.resolve()
    ca = _make_ca(folder, "ca", "/CN=inferd test CA")
    other_ca = _make_ca(folder, "other_ca", "/CN=inferd other test CA")
    server = _make_leaf(
        folder,
        "server",
        "/CN=localhost",
        LEAF + "extendedKeyUsage=serverAuth\nsubjectAltName=DNS:localhost,IP:127.0.0.1\n",
        ca,
        serial=2,
    )
    client = _make_leaf(
        folder, "client", "/CN=inferd test client", LEAF + "extendedKeyUsage=clientAuth\n", ca, 3
    )
    other_client = _make_leaf(
        folder,
        "other_client",
        "/CN=inferd test client",
        LEAF + "extendedKeyUsage=clientAuth\n",
        other_ca,
        serial=3,
    )
    return Certificates(
        ca=ca[0],
        server_cert=server[0],
        server_key=server[1],
        client_cert=client[0],
        client_key=client[1],
        other_ca=other_ca[0],
        other_client_cert=other_client[0],
        other_client_key=other_client[1],
    )
