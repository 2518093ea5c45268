"""The bring-up steps of the harness's levels, one module per step (tools/cluster/levels.py names them).

Each module has `start(cluster)`: it starts its part on a Cluster (tools/cluster/cluster.py) whose
earlier steps ran, reading the level's options from `cluster.options`, and returns once that part is
ready. Steps stand on the client and the ground (build, processes, schemas), never on each other's
internals or on the levels module.
"""
