#!/usr/bin/env bash
# Installs what fsdp-gitops needs, from package registries only (PyPI and the Go module proxy).
#   bash tools/setup.sh        the generators' Python packages (click, PyYAML) and this repository's own
#                              packages (generators, trainer) in editable mode, with the commands
#                              fsdp-expand, fsdp-cluster, fsdp-validate, fsdp-report
#   bash tools/setup.sh test   also the trainer and test packages (torch, transformers, ...) and the
#                              pinned Go tools (kustomize, kubeconform, age, actionlint) into .tools/bin
# Pins live in requirements/*.txt (Python) and tools/go.mod (Go tools).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-python}"
"$python" -m pip install --quiet --disable-pip-version-check -r "$root/requirements/generator.txt"
# Editable, for the console scripts and `import generators` from anywhere; dependencies come from the pins
# above. `python generators/<command>.py` runs its own checkout whatever is installed here.
"$python" -m pip install --quiet --disable-pip-version-check --no-deps -e "$root"
if [ "${1:-}" = "test" ]; then
  "$python" -m pip install --quiet --disable-pip-version-check -r "$root/requirements/test.txt"
  (cd "$root/tools" && GOBIN="$root/.tools/bin" GOFLAGS=-mod=mod go install tool)
fi
