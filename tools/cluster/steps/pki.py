"""Step `pki`: the API server's self-signed serving certificate, the service-account key pair and the
admin token (token auth, the system:masters group)."""

from __future__ import annotations

import subprocess

from tools.cluster.client import TOKEN
from tools.cluster.cluster import Cluster


def start(c: Cluster) -> None:
    pki = c.work / "pki"
    pki.mkdir()

    def run(*args: str) -> None:
        subprocess.run(args, check=True, capture_output=True, cwd=pki)

    run(
        *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2"),
        *("-keyout", "apiserver.key", "-out", "apiserver.crt", "-subj", "/CN=kube-apiserver"),
        *("-addext", f"subjectAltName={c.san}"),
    )
    run("openssl", "genrsa", "-out", "sa.key", "2048")
    run("openssl", "rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub")
    (pki / "tokens.csv").write_text(f'{TOKEN},admin,admin-uid,"system:masters"\n')
