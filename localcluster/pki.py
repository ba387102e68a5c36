"""The local cluster's certificate authority: one CA, and every certificate signed by it.

Every TLS connection in the local cluster is verified as in production, against this CA:
clients of the API server (the harness, the tests, kopf, the demo, kubelet, kube-proxy
and in-cluster Pods, which get the CA through the ``kube-root-ca.crt`` ConfigMap) check the
API server's certificate, and the API server checks each kubelet's. The CA lives in the
control plane's state directory and goes with it; nothing is trusted machine-wide.

Certificates are made with the ``openssl`` command (Debian's), RSA 2048, valid for two days
(a local cluster lives for minutes).
"""

from __future__ import annotations

import ipaddress
import subprocess
from dataclasses import dataclass
from pathlib import Path

DAYS = "2"


def _openssl(*args: str, cwd: Path) -> None:
    done = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"openssl {args[0]} failed: {done.stderr.strip()}")


@dataclass(frozen=True)
class KeyPair:
    cert: Path
    key: Path


class Authority:
    """A CA in ``directory``: ``ca.crt`` and ``ca.key``, made on construction."""

    def __init__(self, directory: Path, name: str = "resident-local-ca"):
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.cert, self.key = self.dir / "ca.crt", self.dir / "ca.key"
        if not self.cert.exists():
            _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", DAYS, "-keyout", str(self.key),
                     "-out", str(self.cert), "-subj", f"/CN={name}",
                     "-addext", "basicConstraints=critical,CA:TRUE",
                     "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=self.dir)

    def issue(self, name: str, common_name: str, *, organization: str | None = None,
              hosts: list[str] = (), server: bool = False, client: bool = False) -> KeyPair:
        """Sign a certificate ``<name>.crt`` (with ``<name>.key``) for ``common_name``;
        ``hosts`` (IP addresses or DNS names) become its subject alternative names."""
        subject = f"/CN={common_name}" + (f"/O={organization}" if organization else "")
        pair = KeyPair(self.dir / f"{name}.crt", self.dir / f"{name}.key")
        csr = self.dir / f"{name}.csr"
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(pair.key), "-out", str(csr),
                 "-subj", subject, cwd=self.dir)
        usages = [u for u, wanted in (("serverAuth", server), ("clientAuth", client)) if wanted]
        extensions = ["basicConstraints=critical,CA:FALSE", "keyUsage=critical,digitalSignature,keyEncipherment"]
        if usages:
            extensions.append("extendedKeyUsage=" + ",".join(usages))
        if hosts:
            extensions.append("subjectAltName=" + ",".join(_san(h) for h in hosts))
        ext_file = self.dir / f"{name}.ext"
        ext_file.write_text("\n".join(extensions) + "\n")
        _openssl("x509", "-req", "-in", str(csr), "-days", DAYS, "-CA", str(self.cert), "-CAkey", str(self.key),
                 "-CAcreateserial", "-extfile", str(ext_file), "-out", str(pair.cert), cwd=self.dir)
        csr.unlink()
        ext_file.unlink()
        return pair


def _san(host: str) -> str:
    try:
        ipaddress.ip_address(host)
        return f"IP:{host}"
    except ValueError:
        return f"DNS:{host}"
