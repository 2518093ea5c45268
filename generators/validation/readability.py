"""Non-root containers can read the Secrets and volumes they mount, and write the shared volume they write.

The trainer image runs as uid 10001. The kubelet decides what such a process may open from the pod's
securityContext and the volume's mode, so the rule is checked from the same fields:

- Secret and ConfigMap volumes (and projected ones): the files belong to root, mode = the item's
  `mode`, else `defaultMode`, else 0644. With a pod `fsGroup` the kubelet gives them that group
  and adds group read (mode | 0440), and every container of the pod is in fsGroup: readable. Without
  fsGroup a non-root process reads them only through the "other" bits (mode & 0004): 0400 and 0440
  are root's alone.
- A PersistentVolumeClaim mounted without `readOnly` is written to. A new volume's root (an FSx for
  Lustre file system, an EBS volume's file system) is root:root 0755, so a non-root process can
  write it only when the pod sets `fsGroup`: the kubelet then gives the root that group with group
  write and setgid, for every CSI driver that declares fsGroupPolicy File, or ReadWriteOnceWithFSType
  on a ReadWriteOnce volume. The FSx for Lustre driver declares ReadWriteOnceWithFSType, so on its
  ReadWriteMany volumes fsGroup is not applied: there the shared-storage Job (base/shared-storage)
  creates the project's folders owned by the trainer's user, and fsGroup stays for drivers that apply it.
- emptyDir is world-writable; hostPath and the rest are out of scope (the training pods use none).

A container is non-root when its runAsUser (container, else pod) is set and not 0, or when it sets
runAsNonRoot with no runAsUser (the image's non-root user). A container with neither is not judged:
its user is whatever the image says.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from generators.validation.manifests import Doc, Problem, obj_name, walk
from generators.validation.semantics import Blame

DEFAULT_MODE = 0o644
# What the kubelet ORs into a Secret or ConfigMap file's mode when the pod sets fsGroup (read-only volumes).
FSGROUP_READ_BITS = 0o440


def pod_specs(data: Any) -> Iterator[tuple[tuple[str, ...], dict]]:
    """(JSON path, pod spec) of every pod spec inside a manifest (Jobs, DaemonSets, PyTorchJob replicas ...)."""
    for at, v in walk(data):
        if isinstance(v, dict) and isinstance(v.get("containers"), list):
            yield at, v


def _uid(pod: dict, c: dict) -> tuple[int | None, bool]:
    """(runAsUser, runAsNonRoot) in effect for a container: its own securityContext over the pod's."""
    pod_sc, c_sc = pod.get("securityContext") or {}, c.get("securityContext") or {}
    uid = c_sc.get("runAsUser", pod_sc.get("runAsUser"))
    non_root = c_sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot"))
    return (uid if isinstance(uid, int) else None), bool(non_root)


def _modes(volume: dict) -> Iterator[tuple[str, int]]:
    """(what, mode) of every file a Secret/ConfigMap/projected volume puts in the container."""
    for kind in ("secret", "configMap"):
        src = volume.get(kind)
        if isinstance(src, dict):
            default = src.get("defaultMode", DEFAULT_MODE)
            name = src.get("secretName") or src.get("name") or "?"
            items = src.get("items") or [{}]
            for item in items:
                yield f"{'Secret' if kind == 'secret' else 'ConfigMap'} {name}", int(item.get("mode", default))
    projected = volume.get("projected")
    if isinstance(projected, dict):
        default = projected.get("defaultMode", DEFAULT_MODE)
        for source in projected.get("sources") or []:
            for kind in ("secret", "configMap"):
                src = (source or {}).get(kind)
                if isinstance(src, dict):
                    for item in src.get("items") or [{}]:
                        yield (
                            f"{'Secret' if kind == 'secret' else 'ConfigMap'} {src.get('name', '?')}",
                            int(item.get("mode", default)),
                        )


def check_readability(docs: Sequence[Doc], blame: Blame = lambda doc, keys: doc.file) -> list[Problem]:
    """Every non-root container can read the Secret/ConfigMap files it mounts and write the
    PersistentVolumeClaims it mounts read-write."""
    problems = []
    for d in docs:
        if not isinstance(d.data, dict):
            continue
        for at, pod in pod_specs(d.data):
            fs_group = (pod.get("securityContext") or {}).get("fsGroup")
            volumes = {v.get("name"): (i, v) for i, v in enumerate(pod.get("volumes") or []) if isinstance(v, dict)}
            for key in ("initContainers", "containers"):
                for c in pod.get(key) or []:
                    if not isinstance(c, dict):
                        continue
                    uid, non_root = _uid(pod, c)
                    if uid == 0 or (uid is None and not non_root):
                        continue
                    who = f"container {c.get('name', '?')} (uid {uid if uid is not None else 'non-root'})"
                    for mount in c.get("volumeMounts") or []:
                        if not isinstance(mount, dict) or mount.get("name") not in volumes:
                            continue
                        vi, volume = volumes[mount["name"]]
                        vat = at + ("volumes", str(vi))
                        msg = _problem(volume, mount, fs_group, who)
                        if msg:
                            file = blame(d, vat)
                            problems.append(Problem(file, d.line if file == d.file else 0, obj_name(d.data), msg))
    return problems


def _problem(volume: dict, mount: dict, fs_group: Any, who: str) -> str:
    where = f"volume {volume.get('name')} at {mount.get('mountPath')}"
    for what, mode in _modes(volume):
        readable = fs_group is not None or mode & 0o004
        if not readable:
            return (
                f"{who} cannot read {what} in {where}: its files are root's with mode {mode:04o} and the pod "
                f"sets no fsGroup; fix: set spec.securityContext.fsGroup to the container's group (the kubelet "
                f"then makes them group-readable) or a defaultMode with other-read"
            )
    if "persistentVolumeClaim" in volume and not mount.get("readOnly") and fs_group is None:
        claim = (volume["persistentVolumeClaim"] or {}).get("claimName", "?")
        return (
            f"{who} writes PersistentVolumeClaim {claim} in {where}, whose new root is root:root 0755, and the "
            f"pod sets no fsGroup; fix: set spec.securityContext.fsGroup (applied by CSI drivers with fsGroupPolicy "
            f"File; on FSx for Lustre the shared-storage Job owns the folders) or mount it readOnly"
        )
    return ""
