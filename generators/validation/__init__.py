"""Validation of the repository as CI and the cluster see it (the job behind generators/validate.py):
index.py (files, YAML, kustomize builds), schemas.py (kubeconform), fluxgraph.py (the Flux graph),
semantics.py (checks no schema can make), pipeline.py (the steps in order), manifests.py (documents
and problems)."""
