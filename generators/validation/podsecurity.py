"""Pod security of every workload in the repository, and Secrets that only look SOPS-encrypted.

Every pod spec (Deployments, DaemonSets, Jobs, PyTorchJob replicas, ...) is checked for host access
and privilege: hostNetwork, hostPID, hostIPC, hostPath volumes, privileged containers, added Linux
capabilities, and containers that may run as root (neither runAsNonRoot nor a non-zero runAsUser on
the pod or the container). Training, service and job pods need none of these. The node-level tools
that do need some (htop/nvtop, the NVIDIA and EFA device plugins) are listed in HOST_ACCESS, one entry
per privilege with the reason, as is the one root Job (the shared volume's ownership, any namespace);
anything not listed there is a problem, for node tools too
(base/node-tools/README.md explains the node tools' privileges to the people who run them).

A Secret with a `sops` block must have every value of data/stringData encrypted (`ENC[...]`) and a
MAC: a plain-text Secret with a copied `sops` block would otherwise reach the cluster unencrypted.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from generators.validation.manifests import PYTORCHJOB, Doc, Problem, gvk, meta, walk
from generators.validation.semantics import Blame, reporter

# (namespace, workload name) -> {privilege: why that workload needs it}. Privileges are "hostNetwork",
# "hostPID", "hostIPC", "hostPath:<path>", "capability:<NAME>", "privileged" and "root".
HOST_ACCESS: dict[tuple[str, str], dict[str, str]] = {
    ("node-tools", "htop"): {
        "hostPID": "htop lists the processes of the whole node (the trainer's included), not only its own",
    },
    ("node-tools", "nvtop"): {
        "hostPID": "nvtop maps GPU memory to the node's processes, which it sees only in the host PID namespace",
    },
    ("device-plugins", "nvidia-device-plugin"): {
        "hostPath:/var/lib/kubelet/device-plugins": "a device plugin registers with the kubelet through its socket",
        "root": "the kubelet's device-plugin socket directory is writable by root only",
    },
    ("device-plugins", "efa-device-plugin"): {
        "hostNetwork": "the EFA plugin reads the node's EFA devices through the host network namespace (upstream)",
        "hostPath:/var/lib/kubelet/device-plugins": "a device plugin registers with the kubelet through its socket",
        "hostPath:/dev/infiniband": "the EFA devices the plugin advertises live there",
        "root": "the kubelet's device-plugin socket directory is writable by root only",
        "privileged": "as the upstream chart (aws/eks-charts, aws-efa-k8s-device-plugin >= 0.5.4): the plugin reads "
        "the node's accelerator topology to align EFA interfaces with GPUs; no narrower context is proven on the "
        "EKS GPU AMI",
    },
    # The one root container outside the node tools: the shared volume's one-time ownership Job
    # (base/shared-storage). The FSx CSI driver declares fsGroupPolicy ReadWriteOnceWithFSType, so the
    # kubelet never applies fsGroup to the ReadWriteMany volume and a new file system's root is
    # root:root 0755; this Job creates the project's folders on it, owned by the trainer's uid 10001.
    # Any namespace ("*"): it runs in each cluster's run namespace.
    ("*", "shared-storage-init"): {
        "root": "only root can create folders in the new file system's root:root 0755 root and hand them to uid 10001",
        "capability:CHOWN": "hands the folders it creates to the trainer's uid and gid",
        "capability:FOWNER": "sets the mode of folders the trainer's uid already owns (a volume used before)",
        "capability:DAC_OVERRIDE": "creates a missing folder inside one already handed to the trainer's uid",
    },
}
SOPS_VALUE = re.compile(r"^ENC\[[A-Z0-9_]+,data:.*\]$", re.S)


def pod_specs(data: Any) -> Iterator[tuple[tuple[str, ...], dict]]:
    """(JSON path, pod spec) of every pod spec in a manifest (a mapping with a list of containers)."""
    for at, v in walk(data):
        if isinstance(v, dict) and isinstance(v.get("containers"), list):
            yield at, v


def _runs_as_non_root(*contexts: Mapping[str, Any]) -> bool:
    """Whether the security contexts, innermost last, keep the container off uid 0."""
    non_root, user = False, None
    for ctx in contexts:
        if "runAsNonRoot" in ctx:
            non_root = bool(ctx["runAsNonRoot"])
        if "runAsUser" in ctx:
            user = ctx["runAsUser"]
    if user == 0:
        return False
    return non_root or (isinstance(user, int) and user > 0)


def privileges(pod: Mapping[str, Any]) -> list[tuple[tuple[str, ...], str]]:
    """(JSON path in the pod spec, privilege) for everything the pod asks of the node."""
    found: list[tuple[tuple[str, ...], str]] = [
        ((key,), key) for key in ("hostNetwork", "hostPID", "hostIPC") if pod.get(key) is True
    ]
    for i, v in enumerate(pod.get("volumes") or []):
        if isinstance(v, dict) and isinstance(v.get("hostPath"), dict):
            path = str(v["hostPath"].get("path") or "")
            found.append((("volumes", str(i), "hostPath"), f"hostPath:{posixpath.normpath(path) if path else ''}"))
    pod_ctx = pod.get("securityContext") or {}
    for key in ("initContainers", "containers", "ephemeralContainers"):
        for i, c in enumerate(pod.get(key) or []):
            if not isinstance(c, dict):
                continue
            ctx = c.get("securityContext") or {}
            at = (key, str(i), "securityContext")
            if ctx.get("privileged") is True:
                found.append((at + ("privileged",), "privileged"))
            for cap in (ctx.get("capabilities") or {}).get("add") or []:
                found.append((at + ("capabilities", "add"), f"capability:{str(cap).upper()}"))
            if not _runs_as_non_root(pod_ctx, ctx):
                found.append((at, "root"))
    # One line per privilege and pod: "root" of several containers is one finding.
    first: dict[str, tuple[str, ...]] = {}
    for keys, p in found:
        first.setdefault(p, keys)
    return [(keys, p) for p, keys in first.items()]


def _advice(privilege: str) -> str:
    if privilege == "root":
        return "set runAsNonRoot: true and a non-zero runAsUser in the pod's securityContext"
    if privilege == "privileged":
        return "drop privileged: true (no workload here needs the whole node)"
    if privilege.startswith("capability:"):
        return "remove capabilities.add (drop ALL instead)"
    return "remove it, or document why a node tool needs it in HOST_ACCESS (generators/validation/podsecurity.py)"


def check_pod_security(docs: Sequence[Doc], blame: Blame = lambda doc, keys: doc.file) -> list[Problem]:
    """Host access, privilege and root in every pod spec; plain-text Secrets dressed as SOPS files."""
    problems: list[Problem] = []
    for d in docs:
        data = d.data
        if not isinstance(data, dict):
            continue
        bad = reporter(problems, d, blame)

        allowed = HOST_ACCESS.get((meta(data, "namespace"), meta(data, "name"))) or HOST_ACCESS.get(
            ("*", meta(data, "name")) if gvk(data) == ("batch", "Job") else ("", ""), {}
        )
        for at, pod in pod_specs(data):
            for keys, privilege in privileges(pod):
                # A privileged PyTorchJob container is reported by the job checks (semantics.py) already;
                # they look at `containers` only, so init and ephemeral containers are reported here.
                reported = privilege == "privileged" and gvk(data) == PYTORCHJOB and keys[0] == "containers"
                if privilege in allowed or reported:
                    continue
                bad(at + keys, f"{privilege.replace(':', ' ', 1)} is not allowed here; {_advice(privilege)}")
        if gvk(data) == ("", "Secret") and "sops" in data:
            sops = data["sops"] if isinstance(data["sops"], dict) else {}
            for section in ("data", "stringData"):
                for key, value in (data.get(section) or {}).items():
                    if not (isinstance(value, str) and SOPS_VALUE.match(value)):
                        bad(
                            (section, str(key)),
                            f"{section}.{key} is not encrypted although the Secret has a sops "
                            "block; encrypt the file with sops (see .sops.yaml)",
                        )
            if not SOPS_VALUE.match(str(sops.get("mac") or "")):
                bad(("sops",), "the sops block has no MAC, so it was not written by sops; encrypt the file with sops")
    return problems
