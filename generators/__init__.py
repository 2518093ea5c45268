"""The generators: four thin Click commands over one folder per job.

    expand.py    matrix.yaml -> overlays/ (load -> expand -> plan -> render -> write)
    cluster.py   matrix.yaml -> overlays/provisioning/ (eksctl, Karpenter)
    validate.py  the repository as CI and the cluster see it
    report.py    benchmark and trainer results -> scaling table and charts

    matrix/      schema, strict loader and expansion of the experiment matrix
    plan/        runs -> per-cluster plans (catalogs, names, memory fit); speed, cost and the --plan table
    render/      plans -> manifests (runs, Flux entries, provisioning), pure
    validation/  the validation pipeline and its checks
    results/     the report's core
    core/        errors, the strict YAML reader, the writer, the Go tools, the commands' Click glue

Imports run one way: commands -> jobs -> core -> the trainer's pure modules (trainer.catalog,
trainer.config, trainer.memory, and trainer.capacity_block for the one reading of a Capacity Block's end).
"""
