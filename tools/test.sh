#!/usr/bin/env bash
# The project's test command (the README's second quick-start command, and what CI runs):
# installs everything, runs ruff (lint, format check) and mypy, checks that overlays/ matches
# matrix.yaml, validates the whole repository with real kustomize + kubeconform + schemas, then runs
# the pytest suite, every tier (tests/README.md; the cluster harness levels included: real
# kube-apiserver, Training Operator, kwok and Flux, built once and cached).
#   CRD schemas: generated from the pinned CRD sources into .tools/schemas/ (tools/cluster/schemas.py);
#   $FSDP_GITOPS_CRD_SCHEMAS overrides the folder.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
python="${PYTHON:-$(bash tools/python.sh)}"
# The real-pods tier runs containers (namespaces, cgroups, mounts): it needs root. Not root, the command
# runs itself again through `sudo -n` (as on CI runners), with this interpreter, PATH and the Go and pip
# cache settings, and root's own HOME so that no root-owned file lands in this user's caches. Without
# root or sudo it stops here, naming the command, instead of skipping a tier.
if [ "$(id -u)" != 0 ]; then
  if sudo -n true 2>/dev/null; then
    echo "[test] the real-pods tier needs root: running as root through sudo -n" >&2
    keep=(PYTHON="$python" PATH="$PATH")
    for v in CI GOFLAGS GOCACHE GOMODCACHE GOPATH GOPROXY PIP_CACHE_DIR PIP_INDEX_URL $(compgen -e | grep '^FSDP_' || true); do
      [ -n "${!v:-}" ] && keep+=("$v=${!v}")
    done
    exec sudo -n -H env "${keep[@]}" bash "$root/tools/test.sh" "$@"
  fi
  echo "tools/test.sh: the real-pods tier needs root: run it as root ('sudo bash tools/test.sh')" >&2
  exit 2
fi
stage() { printf '[test %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
stage "install (tools/setup.sh test)"
PYTHON="$python" bash tools/setup.sh test
# Lint, format and types first (pinned in requirements/test.txt, configured in pyproject.toml): any
# finding fails the command.
stage "lint, format and types (ruff, mypy)"
"$python" -m ruff check .
"$python" -m ruff format --check .
# mypy's incremental cache lives beside the other caches, so a fresh clone checks in about a second
# instead of 40 (entries are checked against each file's hash, never trusted blindly).
"$python" -m mypy --cache-dir "${FSDP_GITOPS_CACHE:-$HOME/.cache/fsdp-gitops}/mypy"
export FSDP_GITOPS_CRD_SCHEMAS="${FSDP_GITOPS_CRD_SCHEMAS:-$("$python" -m tools.cluster.schemas)}"
stage "generated files up to date with matrix.yaml (overlays/, docs/generated/, overlays/provisioning/)"
"$python" generators/expand.py matrix.yaml --check
"$python" generators/cluster.py matrix.yaml --check
stage "validate every manifest (kustomize build, kubeconform strict, Flux graph, semantics)"
"$python" generators/validate.py --crd-schemas "$FSDP_GITOPS_CRD_SCHEMAS"
status=0
# Spread over the CPUs (FSDP_TEST_WORKERS=0 runs in one process): whole modules per worker, each
# cluster control plane's tests on one worker, the real-pods levels one after another on one worker
# (tests/conftest.py). One worker more than CPUs: the cluster tests spend much of their time waiting on
# controllers, which a further worker fills (measured: benchmarks/reports/2026-12-02-test-command.md).
workers="${FSDP_TEST_WORKERS:-$(($(nproc) + 1))}"
stage "tests, every tier ($workers workers)"
"$python" -m pytest -q -n "$workers" "$@" || status=$?
if [ "$status" -eq 5 ]; then
  echo "pytest collected no tests: that is a failure of this suite" >&2
  exit 1
fi
exit "$status"
