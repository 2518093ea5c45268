#!/usr/bin/env bash
# Prints the Python interpreter fsdp-gitops installs into and runs with, making one if needed:
#   1. the active virtualenv ($VIRTUAL_ENV);
#   2. this checkout's .venv/, once made;
#   3. `python` on PATH where pip may install into it (pyenv, actions/setup-python, a conda env);
#   4. else a new .venv/ made with python3: Debian's and Ubuntu's system Python has no `python` command
#      and refuses pip installs (PEP 668's EXTERNALLY-MANAGED); python3-venv is installed when
#      Debian's python3 lacks ensurepip (as root or through sudo -n).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv"
if [ -n "${VIRTUAL_ENV:-}" ] && [ -x "$VIRTUAL_ENV/bin/python" ]; then
  echo "$VIRTUAL_ENV/bin/python"
  exit 0
fi
if [ -x "$venv/bin/python" ]; then
  echo "$venv/bin/python"
  exit 0
fi
# pip may install into an interpreter that is a virtualenv or carries no EXTERNALLY-MANAGED marker.
may_install='import os, sys, sysconfig
managed = os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED"))
sys.exit(0 if sys.version_info >= (3, 11) and (sys.prefix != sys.base_prefix or not managed) else 1)'
if command -v python >/dev/null 2>&1 && python -c "$may_install" 2>/dev/null; then
  command -v python
  exit 0
fi
base="$(command -v python3 || command -v python || true)"
if [ -z "$base" ]; then
  echo "tools/python.sh: no python3 on PATH: install Python 3.11 or newer (docs/versions.md)" >&2
  exit 2
fi
if ! "$base" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)'; then
  echo "tools/python.sh: $base is Python $("$base" -c 'import platform; print(platform.python_version())'), fsdp-gitops needs 3.11 or newer" >&2
  exit 2
fi
if ! "$base" -c 'import ensurepip, venv' 2>/dev/null; then
  # Debian and Ubuntu ship venv's pip in a package of its own.
  pkg="python3-venv"
  if [ "$(id -u)" -eq 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$pkg" >/dev/null
  elif sudo -n true 2>/dev/null; then
    sudo -n apt-get update -qq && sudo -n env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$pkg" >/dev/null
  else
    echo "tools/python.sh: $base cannot make a virtualenv: run 'sudo apt-get install -y $pkg', then this command again" >&2
    exit 2
  fi
fi
echo "[setup] making the virtualenv .venv/ with $base (the system Python refuses pip, PEP 668)" >&2
"$base" -m venv "$venv" >&2
echo "$venv/bin/python"
