#!/usr/bin/env bash
# The project's test command (the README's second quick-start command, and what CI runs):
# installs everything, checks that overlays/ matches matrix.yaml, validates the whole repository
# with real kustomize + kubeconform + schemas, then runs the pytest suite.
#   CRD schemas: $FSDP_GITOPS_CRD_SCHEMAS, default ../shared/schemas/crds beside the checkout.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
python="${PYTHON:-python}"
export FSDP_GITOPS_CRD_SCHEMAS="${FSDP_GITOPS_CRD_SCHEMAS:-$root/../shared/schemas/crds}"
bash tools/setup.sh test
"$python" generators/expand.py matrix.yaml --check
"$python" generators/validate.py --crd-schemas "$FSDP_GITOPS_CRD_SCHEMAS"
status=0
"$python" -m pytest -q "$@" || status=$?
if [ "$status" -eq 5 ]; then
  echo "pytest collected no tests: that is a failure of this suite" >&2
  exit 1
fi
exit "$status"
