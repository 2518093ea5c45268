#!/usr/bin/env bash
# Installs what fsdp-gitops needs, from package registries only (PyPI, the Go module proxy, Debian).
#   bash tools/setup.sh        the generators' Python packages (click, PyYAML) and this repository's own
#                              packages (generators, trainer) in editable mode, with the commands
#                              fsdp-expand, fsdp-cluster, fsdp-validate, fsdp-report, fsdp-status
#   bash tools/setup.sh test   also the trainer and test packages (torch, transformers, ...), the
#                              pinned Go tools (kustomize, kubeconform, age, actionlint) into .tools/bin
#                              and the Debian packages the real-pods level builds against
#                              (requirements/debian.txt: runc links libseccomp)
# Pins live in requirements/*.txt (Python, Debian) and tools/go.mod (Go tools). The interpreter is
# $PYTHON, else the one tools/python.sh picks (the active virtualenv, `python` where pip may install
# into it, else .venv/ made with python3: Debian's and Ubuntu's system Python refuses pip, PEP 668).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-$(bash "$root/tools/python.sh")}"
pip=("$python" -m pip install --quiet --disable-pip-version-check)
step() { printf '[setup %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
step "Python packages of the generators ($python)"
"${pip[@]}" -r "$root/requirements/generator.txt"
# Editable, for the console scripts and `import generators` from anywhere; dependencies come from the pins
# above. `python generators/<command>.py` runs its own checkout whatever is installed here.
"${pip[@]}" --no-deps -e "$root"
if [ "${1:-}" = "test" ]; then
  bash "$root/tools/debian.sh"
  step "Python packages of the trainer and the tests (torch is several GB on a cold cache)"
  "${pip[@]}" -r "$root/requirements/test.txt"
  step "pinned Go tools into .tools/bin (minutes on a cold Go cache)"
  (cd "$root/tools" && GOBIN="$root/.tools/bin" GOFLAGS=-mod=mod go install tool)
  step "done"
fi
