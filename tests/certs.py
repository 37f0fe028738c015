"""A throwaway PKI for TLS tests, made with openssl: a CA, a server certificate for 127.0.0.1
and localhost, and a client certificate, each as a Kubernetes TLS Secret lays them out
(``tls.crt``, ``tls.key``, ``ca.crt`` in one directory)."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

# An elliptic-curve key: much faster to make than RSA, and what redis-server and Python accept.
KEY = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
EXTENSIONS = {
    "server": "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n",
    "client": "extendedKeyUsage=clientAuth\n",
}


@dataclass(frozen=True)
class Pki:
    ca: Path  # the CA certificate (its key stays in the working directory)
    server: Path  # directory: tls.crt, tls.key, ca.crt
    client: Path  # directory: tls.crt, tls.key, ca.crt


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_pki(directory: Path) -> Pki:
    work = directory / "work"
    work.mkdir(parents=True)
    openssl("req", "-x509", *KEY, "-days", "2", "-subj", "/CN=farm test CA",
            "-keyout", "ca.key", "-out", "ca.crt", cwd=work)  # fmt: skip
    for name, extensions in EXTENSIONS.items():
        (work / f"{name}.ext").write_text(extensions)
        openssl("req", *KEY, "-subj", f"/CN=farm test {name}",
                "-keyout", f"{name}.key", "-out", f"{name}.csr", cwd=work)  # fmt: skip
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                "-CAcreateserial", "-days", "2", "-extfile", f"{name}.ext",
                "-out", f"{name}.crt", cwd=work)  # fmt: skip
        secret = directory / name
        secret.mkdir()
        shutil.copy(work / f"{name}.crt", secret / "tls.crt")
        shutil.copy(work / f"{name}.key", secret / "tls.key")
        shutil.copy(work / "ca.crt", secret / "ca.crt")
    return Pki(ca=work / "ca.crt", server=directory / "server", client=directory / "client")
