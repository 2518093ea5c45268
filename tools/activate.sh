# Sourced by the README's first command: `. tools/activate.sh && python generators/expand.py matrix.yaml`.
# Installs the generators (tools/setup.sh) into the interpreter tools/python.sh picks and, when that is
# a virtualenv, activates it in this shell, so that `python` (and fsdp-expand, ...) is the one installed
# into. Written for bash and zsh; it sets no shell option of the caller's.
_fsdp_root="$(cd "$(dirname "${BASH_SOURCE[0]:-${(%):-%x}}")/.." && pwd)"
_fsdp_python="$(bash "$_fsdp_root/tools/python.sh")" \
  && PYTHON="$_fsdp_python" bash "$_fsdp_root/tools/setup.sh" "$@" \
  && { [ ! -f "$(dirname "$_fsdp_python")/../pyvenv.cfg" ] || . "$(dirname "$_fsdp_python")/activate"; }
_fsdp_status=$?
unset _fsdp_root _fsdp_python
return "$_fsdp_status" 2>/dev/null || exit "$_fsdp_status"
