"""One loopback HTTP server for Flux's sources in the cluster tests.

    python -m tools.cluster.servers ROOT PORT

    /git/<repo>.git/...      git smart HTTP (`git http-backend` as CGI) over ROOT/git; go-git, which
                             Flux uses, speaks only the smart protocol
    /v2/<name>/...           a read-only OCI registry over ROOT/oci/<name>/{manifests/<tag>,blobs/<digest>}
                             (Helm charts for OCIRepository sources)
    /<anything else>         static files under ROOT/static (Helm repositories: index.yaml and charts)

It binds 127.0.0.1 only. Everything is served as the test wrote it; nothing is fetched.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"


class Handler(SimpleHTTPRequestHandler):
    root: Path

    def __init__(self, *args, **kwargs):
        super().__init__(*args, directory=str(self.root / "static"), **kwargs)

    def log_message(self, fmt: str, *args) -> None:
        sys.stderr.write(f"{self.command} {self.path} -> {fmt % args}\n")

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        if self.path.startswith("/git/"):
            return self._git()
        if self.path.startswith("/v2/"):
            return self._oci(body=True)
        return super().do_GET()

    def do_HEAD(self) -> None:  # noqa: N802
        if self.path.startswith("/v2/"):
            return self._oci(body=False)
        return super().do_HEAD()

    def do_POST(self) -> None:  # noqa: N802
        if self.path.startswith("/git/"):
            return self._git()
        self.send_error(405)

    def _git(self) -> None:
        path, _, query = self.path[len("/git") :].partition("?")
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "GIT_PROJECT_ROOT": str(self.root / "git"),
            "GIT_HTTP_EXPORT_ALL": "1",
            "REQUEST_METHOD": self.command,
            "PATH_INFO": path,
            "QUERY_STRING": query,
            "CONTENT_TYPE": self.headers.get("Content-Type", ""),
            "CONTENT_LENGTH": str(len(body)),
            "REMOTE_ADDR": "127.0.0.1",
            "HTTP_CONTENT_ENCODING": self.headers.get("Content-Encoding", ""),
            "GIT_PROTOCOL": self.headers.get("Git-Protocol", ""),
        }
        out = subprocess.run(["git", "http-backend"], input=body, env=env, capture_output=True).stdout
        head, _, payload = out.partition(b"\r\n\r\n")
        status, headers = 200, []
        for line in head.decode().split("\r\n"):
            key, _, value = line.partition(":")
            if key.lower() == "status":
                status = int(value.split()[0])
            elif key:
                headers.append((key, value.strip()))
        self.send_response(status)
        for key, value in headers:
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def _oci(self, body: bool) -> None:
        parts = self.path.split("?")[0].strip("/").split("/")
        if parts == ["v2"]:
            return self._send(200, b"{}", "application/json", body)
        if len(parts) >= 4 and parts[-2] in ("manifests", "blobs"):
            name, kind, ref = "/".join(parts[1:-2]), parts[-2], parts[-1]
            f = self.root / "oci" / name / kind / ref.replace(":", "_")
            if f.is_file():
                data = f.read_bytes()
                ctype = MANIFEST_TYPE if kind == "manifests" else "application/octet-stream"
                return self._send(200, data, ctype, body, digest="sha256:" + hashlib.sha256(data).hexdigest())
        if len(parts) >= 4 and parts[-2:] == ["tags", "list"]:
            name = "/".join(parts[1:-2])
            tags = sorted(
                p.name for p in (self.root / "oci" / name / "manifests").glob("*") if not p.name.startswith("sha256")
            )
            return self._send(200, json.dumps({"name": name, "tags": tags}).encode(), "application/json", body)
        return self._send(404, b'{"errors":[{"code":"NAME_UNKNOWN"}]}', "application/json", body)

    def _send(self, status: int, data: bytes, ctype: str, body: bool, digest: str = "") -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        if digest:
            self.send_header("Docker-Content-Digest", digest)
        self.end_headers()
        if body:
            self.wfile.write(data)


def main(argv: list[str]) -> int:
    root, port = Path(argv[0]).resolve(), int(argv[1])
    Handler.root = root
    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
