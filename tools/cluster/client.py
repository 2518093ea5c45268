"""The harness's client of a started control plane: kubectl, reads straight from the API server, waits.

    cluster.kubectl("get", "pods", "-A")                 # kubectl with the cluster's kubeconfig
    cluster.apply([doc, ...])                            # server-side apply
    cluster.get("pytorchjob", "fsdp-runs", name="x")     # what `kubectl get ... -o json` prints
    cluster.wait_for(check, 60, "what it waits for")     # poll while every component stays alive

On the real-pods level the API server listens inside the level's network namespace only: kubectl runs
under `nsenter -n` and HTTP requests from a thread that joined the namespace (processes.in_netns).
"""

from __future__ import annotations

import json
import ssl
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from tools.cluster import build, processes
from tools.cluster.processes import Process, StartError

TOKEN = "harness-admin-token"
# One discovered resource: (group/version, plural, namespaced, Kind, the names kubectl knows it by, group).
Resource = tuple[str, str, bool, str, frozenset[str], str]


def http_get(url: str, insecure: bool = False) -> str | None:
    """The body of GET url ("ok" for a JSON health answer of etcd), None when it cannot be reached.
    insecure: the scheduler's and controller-manager's self-signed health endpoints on loopback."""
    ctx = None
    if insecure:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    try:
        with urllib.request.urlopen(url, timeout=3, context=ctx) as r:
            body = r.read().decode()
    except OSError:
        return None
    try:
        data = json.loads(body)
    except json.JSONDecodeError:
        return body.strip()
    return "ok" if isinstance(data, dict) and data.get("health") == "true" else body


class Client:
    """kubectl and the API server as the harness's admin; the Cluster (tools/cluster/cluster.py) is one."""

    server: str
    kubeconfig: Path
    holder: int  # the real-pods level's namespace holder (0: the host's namespaces)
    procs: dict[str, Process]
    ssl_context: ssl.SSLContext | None
    discovery: list[Resource] | None

    # ------------------------------------------------------------------------------------- where

    def in_netns(self, fn: Callable[[], Any]) -> Any:
        """fn() where the components listen: inside the holder's network namespace on the real-pods
        level, else here."""
        return processes.in_netns(self.holder, fn) if self.holder else fn()

    def get_url(self, url: str, insecure: bool = False) -> str | None:
        return self.in_netns(lambda: http_get(url, insecure))

    # --------------------------------------------------------------------------------- the API server

    def api_get(self, path: str, accept: str = "", timeout_s: float = 5) -> str:
        """The body of GET path as the admin; any status but 200 raises (an OSError, as urllib's own)."""
        status, body = self.api_request(path, accept, timeout_s)
        if status != 200:
            raise OSError(f"GET {path}: HTTP {status}: {body[:200]}")
        return body

    def api_request(self, path: str, accept: str = "", timeout_s: float = 30) -> tuple[int, str]:
        """GET path from the API server as the admin: (status, body), error statuses included."""
        headers = {"Authorization": f"Bearer {TOKEN}", **({"Accept": accept} if accept else {})}
        req = urllib.request.Request(self.server + path, headers=headers)

        def get() -> tuple[int, str]:
            try:
                with urllib.request.urlopen(req, timeout=timeout_s, context=self.ssl_context) as r:
                    return r.status, r.read().decode()
            except urllib.error.HTTPError as e:
                return e.code, e.read().decode()

        result: tuple[int, str] = self.in_netns(get)
        return result

    # ---------------------------------------------------------------------------------------- kubectl

    def kubectl_result(
        self, *args: str, stdin: str | None = None, timeout_s: float = 300
    ) -> subprocess.CompletedProcess:
        netns = ["nsenter", "-t", str(self.holder), "-n"] if self.holder else []
        return subprocess.run(
            [*netns, build.tool_path("kubectl"), f"--kubeconfig={self.kubeconfig}", *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )

    def kubectl(self, *args: str, stdin: str | None = None, timeout_s: float = 300) -> str:
        res = self.kubectl_result(*args, stdin=stdin, timeout_s=timeout_s)
        if res.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)} failed: {res.stderr.strip()}")
        return res.stdout

    def apply(self, docs: list[dict[str, Any]]) -> str:
        return self.kubectl(
            "apply", "--server-side", "--force-conflicts", "-f", "-", stdin=yaml.safe_dump_all(docs, sort_keys=False)
        )

    def get(self, kind: str, namespace: str | None = None, name: str = "", selector: str = "") -> Any:
        """What `kubectl get KIND [NAME] -o json` prints (-n NAMESPACE, else -A for a list; -l SELECTOR),
        read straight from the API server: the tests poll this every second, and a kubectl start per poll
        cost more CPU than the polling itself. A kind discovery does not know goes through kubectl."""
        found = self.resource(kind)
        if found is None:
            args = ["get", kind, *([name] if name else []), "-o", "json"]
            args += ["-n", namespace] if namespace else ["-A"] if not name else []
            if selector:
                args += ["-l", selector]
            return json.loads(self.kubectl(*args))
        group_version, plural, namespaced, kind_name = found
        path = "/api/v1" if group_version == "v1" else f"/apis/{group_version}"
        ns = namespace or ("default" if name else "")
        if namespaced and ns:
            path += f"/namespaces/{urllib.parse.quote(ns)}"
        path += f"/{plural}" + (f"/{urllib.parse.quote(name)}" if name else "")
        if selector:
            path += "?" + urllib.parse.urlencode({"labelSelector": selector})
        status, body = self.api_request(path)
        if status != 200:
            try:
                message = json.loads(body).get("message", body)
            except json.JSONDecodeError:
                message = body
            raise RuntimeError(
                f"kubectl get {' '.join(filter(None, [kind, name]))} failed: Error from server: {message}"
            )
        obj = json.loads(body)
        if name:
            return obj
        for item in obj.get("items", []):  # a list leaves them out; kubectl's List has them on every item
            item.setdefault("apiVersion", group_version)
            item.setdefault("kind", kind_name)
        return {"apiVersion": "v1", "kind": "List", "items": obj.get("items", []), "metadata": {"resourceVersion": ""}}

    def resource(self, kind: str) -> tuple[str, str, bool, str] | None:
        """kubectl's reading of a resource name (plural, singular, short name or kind, optionally followed
        by .group or .version.group) -> (group/version, plural, namespaced, Kind), from the server's
        aggregated discovery; asked again once when the name is not known yet (CRDs applied since)."""
        for fresh in (False, True):
            if fresh or self.discovery is None:
                self.discovery = self.discover()
            for entry in self.discovery:
                if names_resource(kind, entry):
                    return entry[0], entry[1], entry[2], entry[3]
        return None

    def discover(self) -> list[Resource]:
        """Every resource, the core group first, then the groups and versions in the server's order."""
        accept = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
        found = []
        for path in ("/api", "/apis"):
            for group in json.loads(self.api_get(path, accept, timeout_s=30)).get("items", []):
                gname = group.get("metadata", {}).get("name", "")
                for version in group.get("versions", []):
                    gv = f"{gname}/{version['version']}" if gname else version["version"]
                    for r in version.get("resources", []):
                        kind_name = r.get("responseKind", {}).get("kind", "")
                        names = {
                            r["resource"],
                            r.get("singularResource", ""),
                            kind_name.lower(),
                            *r.get("shortNames", []),
                        }
                        namespaced = r.get("scope") == "Namespaced"
                        found.append((gv, r["resource"], namespaced, kind_name, frozenset(names - {""}), gname))
        return found

    # ------------------------------------------------------------------------------------------ waits

    def wait_for(self, check: Callable[[], Any], timeout_s: float, what: str) -> Any:
        """Poll check() until it returns something truthy; every component must stay alive meanwhile."""
        deadline = time.monotonic() + timeout_s
        while True:
            for p in self.procs.values():
                if p.popen.poll() is not None:
                    raise StartError(f"{p.name} exited with {p.popen.returncode} while waiting for {what}:\n{p.tail()}")
            value = check()
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what}: not reached in {timeout_s:.0f} s")
            time.sleep(1)


def names_resource(kind: str, entry: Resource) -> bool:
    """Whether kubectl's resource argument `kind` names the discovered resource `entry`."""
    gv, _, _, _, names, group = entry
    version = gv.rsplit("/", 1)[-1]
    name = kind.lower()
    if name in names:
        return True
    return any(group and name in (f"{n}.{group}", f"{n}.{version}.{group}") for n in names)
