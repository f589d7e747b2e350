#!/usr/bin/env bash
# Installs what build.sh and smoke.sh need from Debian's packages: buildah (images without a
# daemon, chroot isolation), debootstrap (a bookworm base when none can be pulled) and binutils
# (objcopy, which compresses the binaries' line tables; a Rust toolchain has it already). No
# podman: nothing here runs a container (crun needs cgroups these machines do not offer).
# Root (or sudo), as scripts/setup.sh; a no-op when both are there.
set -euo pipefail

missing=()
command -v buildah >/dev/null 2>&1 || missing+=(buildah)
command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
command -v objcopy >/dev/null 2>&1 || missing+=(binutils)
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-tools: buildah, debootstrap and objcopy are installed"
  exit 0
fi
sudo=()
[ "$(id -u)" -eq 0 ] || sudo=(sudo)
"${sudo[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y --no-install-recommends "${missing[@]}"
