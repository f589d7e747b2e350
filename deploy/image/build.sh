#!/usr/bin/env bash
# Builds the kvindex image without a container daemon: buildah with chroot isolation, from the
# release binaries of this checkout, then smoke-tests it (smoke.sh) and writes it as an OCI
# archive, the artifact to push to a registry (`skopeo copy oci-archive:<file> docker://...`).
#
# The base is the image --base names (a Debian bookworm image, e.g. debian:bookworm-slim where a
# registry is reachable; the runtime libraries are installed into it if it lacks them) or, by
# default, one made here with debootstrap (bookworm minbase + ca-certificates + librocksdb7.8,
# under two minutes; kept in buildah's store as localhost/kvindex-base:bookworm and reused).
# Layout, user (65532) and ports are deploy/Dockerfile's (deploy/image/Containerfile).
#
# Usage: deploy/image/build.sh [--base IMAGE] [--rebuild-base] [--no-cargo] [--bin-dir DIR]
#                              [--tag NAME] [--out FILE] [--no-smoke] [--base-only]
#   --base IMAGE     build on this image instead of the debootstrap base
#   --rebuild-base   make the debootstrap base again (after a Debian point release)
#   --no-cargo       take the binaries already built (default: cargo build --release first)
#   --bin-dir DIR    take the binaries from DIR (built for Debian bookworm or older); implies
#                    --no-cargo (default $CARGO_TARGET_DIR/release)
#   --tag NAME       the image's name (default localhost/kvindex:<appVersion of the chart>)
#   --out FILE       the OCI archive (default $CARGO_TARGET_DIR/image/kvindex-<version>.oci.tar)
#   --no-smoke       skip the smoke test (the archive is then written untested)
#   --base-only      only make (or find) the debootstrap base
# Needs root (buildah's store, debootstrap, the smoke test's chroot), buildah and debootstrap
# (deploy/image/install-tools.sh) and, for the smoke test, the venv of scripts/setup.sh.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
# shellcheck source=scripts/env.sh
source "$root/scripts/env.sh"

base=""
pull=false # a given base: pulled when not in buildah's store
rebuild_base=0
cargo=1
bin_dir="$CARGO_TARGET_DIR/release"
tag=""
out=""
smoke=1
base_only=0
while [ $# -gt 0 ]; do
  case "$1" in
    --base) base=$2; shift 2 ;;
    --rebuild-base) rebuild_base=1; shift ;;
    --no-cargo) cargo=0; shift ;;
    --bin-dir) bin_dir=$2; cargo=0; shift 2 ;;
    --tag) tag=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --no-smoke) smoke=0; shift ;;
    --base-only) base_only=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "build.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

for tool in buildah debootstrap objcopy; do
  command -v "$tool" >/dev/null 2>&1 || { echo "build.sh: $tool missing: run deploy/image/install-tools.sh" >&2; exit 1; }
done
[ "$(id -u)" -eq 0 ] || { echo "build.sh: run as root (buildah's store, debootstrap, chroot)" >&2; exit 1; }

# The version the manifests name the image by (the chart's appVersion), the commit, the source.
version=$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\} *$/\1/p' "$root/deploy/helm/kvindex/Chart.yaml")
source_url=$(sed -n 's/^home: *//p' "$root/deploy/helm/kvindex/Chart.yaml")
revision=$(git -C "$root" rev-parse HEAD)
[ -z "$(git -C "$root" status --porcelain --untracked-files=no)" ] || revision="$revision-dirty"
tag=${tag:-localhost/kvindex:$version}
out=${out:-$CARGO_TARGET_DIR/image/kvindex-$version.oci.tar}
bins=(kvindex kvindex-router kvindex-tokenizer)

declare -A took
phase_start=$SECONDS
phase() { # phase NAME: the time since the previous phase ended goes to NAME
  took[$1]=$((SECONDS - phase_start))
  phase_start=$SECONDS
}

if [ -z "$base" ]; then
  base=localhost/kvindex-base:bookworm
  pull=never
  if [ "$rebuild_base" -eq 1 ] || ! buildah inspect --type image "$base" >/dev/null 2>&1; then
    echo "== debootstrap: bookworm minbase + ca-certificates + librocksdb7.8 -> $base"
    old_base=$(buildah inspect --type image --format '{{.FromImageID}}' "$base" 2>/dev/null || true)
    rootfs=$(mktemp -d /var/tmp/kvindex-base.XXXXXX)
    ctr=""
    cleanup_base() {
      [ -z "$ctr" ] || buildah rm "$ctr" >/dev/null 2>&1 || true
      local m
      for m in proc sys dev/pts dev; do # what a failed debootstrap may leave mounted
        ! mountpoint -q "$rootfs/$m" || umount -l "$rootfs/$m"
      done
      rm -rf --one-file-system "$rootfs"
    }
    trap cleanup_base EXIT
    # Debian's default mirror unless DEBIAN_MIRROR names another.
    debootstrap --variant=minbase --include=ca-certificates,librocksdb7.8 bookworm "$rootfs" ${DEBIAN_MIRROR:+"$DEBIAN_MIRROR"}
    # As debian:bookworm-slim: no package lists or caches, no docs but the copyright files, no
    # man pages or translations (nor from later installs: dpkg's path-exclude), no device
    # nodes (the runtime provides /dev).
    rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/cache/apt/archives/*.deb \
      "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/* "$rootfs"/var/log/*.log "$rootfs"/var/log/apt/* "$rootfs"/dev/*
    find "$rootfs/usr/share/doc" -mindepth 1 ! -type d ! -name copyright -delete
    find "$rootfs/usr/share/doc" -mindepth 1 -type d -empty -delete
    find "$rootfs/usr/share/locale" -mindepth 1 -maxdepth 1 ! -name locale.alias -exec rm -rf {} +
    printf '%s\n' 'path-exclude /usr/share/doc/*' 'path-include /usr/share/doc/*/copyright' \
      'path-exclude /usr/share/man/*' 'path-exclude /usr/share/info/*' \
      'path-exclude /usr/share/locale/*' 'path-include /usr/share/locale/locale.alias' \
      >"$rootfs/etc/dpkg/dpkg.cfg.d/kvindex-slim"
    # Imported as buildah's own: the tree copied into an empty container, committed.
    ctr=$(buildah from scratch)
    mnt=$(buildah mount "$ctr")
    tar -C "$rootfs" --numeric-owner -cf - . | tar -C "$mnt" --numeric-owner -xpf -
    buildah umount "$ctr" >/dev/null
    buildah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --cmd /bin/bash \
      --label org.opencontainers.image.description="Debian bookworm minbase + ca-certificates + librocksdb7.8 (debootstrap)" \
      "$ctr"
    buildah commit --rm "$ctr" "$base" >/dev/null
    ctr=""
    [ -z "$old_base" ] || buildah rmi "$old_base" >/dev/null 2>&1 || true # unless an image still uses it
    cleanup_base
    trap - EXIT
  else
    echo "== base: $base (stored; --rebuild-base to make it again)"
  fi
fi
phase base
[ "$base_only" -eq 0 ] || { echo "base: $base"; exit 0; }

if [ "$cargo" -eq 1 ]; then
  echo "== cargo build --release (kvindex, kvindex-router, kvindex-tokenizer)"
  (cd "$root" && cargo build --release --locked \
    -p kvindex-server --bin kvindex -p kvindex-router --bin kvindex-router -p kvindex-tokenizer --bin kvindex-tokenizer)
  bin_dir="$CARGO_TARGET_DIR/release"
fi
for b in "${bins[@]}"; do
  [ -x "$bin_dir/$b" ] || { echo "build.sh: $bin_dir/$b missing (build without --no-cargo)" >&2; exit 1; }
done
phase cargo

echo "== image $tag on $base"
old_image=$(buildah inspect --type image --format '{{.FromImageID}}' "$tag" 2>/dev/null || true)
context=$(mktemp -d /var/tmp/kvindex-image.XXXXXX)
trap 'rm -rf "$context"' EXIT
# The release profile keeps line tables (file:line in panics' backtraces); compressed, they
# take a third of the room (345 -> 130 MB for the three) and backtraces still read them.
for b in "${bins[@]}"; do
  objcopy --compress-debug-sections=zlib "$bin_dir/$b" "$context/$b"
done
buildah bud --isolation chroot --pull="$pull" -f "$here/Containerfile" --build-arg BASE="$base" \
  --label org.opencontainers.image.title=kvindex \
  --label org.opencontainers.image.description="kvindex, kvindex-router and kvindex-tokenizer: precise prefix-cache index and router for LLM serving" \
  --label org.opencontainers.image.version="$version" \
  --label org.opencontainers.image.revision="$revision" \
  --label org.opencontainers.image.source="$source_url" \
  --label org.opencontainers.image.licenses=Apache-2.0 \
  --label org.opencontainers.image.created="$(date -u +%Y-%m-%dT%H:%M:%SZ)" \
  -t "$tag" "$context"
new_image=$(buildah inspect --type image --format '{{.FromImageID}}' "$tag")
[ -z "$old_image" ] || [ "$old_image" = "$new_image" ] || buildah rmi "$old_image" >/dev/null 2>&1 || true
phase image

if [ "$smoke" -eq 1 ]; then
  "$here/smoke.sh" "$tag"
fi
phase smoke

echo "== OCI archive $out"
mkdir -p "$(dirname "$out")"
rm -f "$out"
buildah push "$tag" "oci-archive:$out:$version"
phase archive

size=$(buildah images --format '{{.Size}}' "$tag" | head -n 1)
echo "image: $tag ($size unpacked; archive $(du -h "$out" | cut -f1))"
echo "labels: version=$version revision=$revision source=$source_url"
echo "took: cargo ${took[cargo]} s, base ${took[base]} s, image ${took[image]} s, smoke ${took[smoke]} s, archive ${took[archive]} s, total $SECONDS s"
