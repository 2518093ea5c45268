#!/usr/bin/env bash
# Installs the Debian packages of requirements/debian.txt that are missing: with apt-get as root,
# through `sudo -n` otherwise; without either it names the command to run and fails.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mapfile -t wanted < <(sed -e 's/#.*//' -e '/^[[:space:]]*$/d' "$root/requirements/debian.txt")
missing=()
for p in "${wanted[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ "${#missing[@]}" -eq 0 ] && exit 0
if ! command -v apt-get >/dev/null 2>&1; then
  echo "tools/debian.sh: ${missing[*]} missing and no apt-get: install them with your package manager" >&2
  exit 2
fi
if [ "$(id -u)" -eq 0 ]; then
  as_root=()
elif sudo -n true 2>/dev/null; then
  as_root=(sudo -n)
else
  echo "tools/debian.sh: ${missing[*]} missing: run 'sudo apt-get install -y ${missing[*]}', then this command again" >&2
  exit 2
fi
printf '[setup %s] Debian packages: %s\n' "$(date +%H:%M:%S)" "${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
"${as_root[@]}" apt-get update -qq
"${as_root[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
