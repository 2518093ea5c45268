"""The real Kubernetes parts the test suite runs, on loopback, from pinned sources. Top-down:

levels.py        the levels (api, operator, flux, pods) and add-on options, each a named list of steps
steps/           one module per bring-up step: start(cluster)
cluster.py       a started cluster: work folder, processes, fake nodes; client.py talks to it
certs.py         the webhook certificates of every controller run as a process
image/           the OCI images of the real-pods level, built from the repository without Docker
gitops.py, servers.py, dryrun.py, scrape.py   what tests put on a level: Flux sources, dry runs,
                 prometheus-operator's scrape configuration
realpods.py      the real-pods level's shared state (namespaces, cgroups, nodes) and its clean-up
build.py, processes.py, schemas.py            the ground: pinned binaries, process lifetimes, CRDs
go/              the pinned Go modules, one folder per upstream project (their dependency graphs
                 conflict), built by build.py
"""
