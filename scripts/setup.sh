#!/usr/bin/env bash
# Installs the Debian packages gaac builds against, if any is missing. Safe to run repeatedly.
set -euo pipefail

packages=(cmake g++ make pkg-config clang libclang-rt-14-dev libfuzzer-14-dev
          libgtest-dev libbenchmark-dev libcli11-dev nlohmann-json3-dev libfmt-dev
          libzstd-dev liblz4-dev libxxhash-dev)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "setup: installing ${missing[*]}" >&2
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "setup: need root (or sudo) to install: ${missing[*]}" >&2; exit 1; }
  sudo="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
