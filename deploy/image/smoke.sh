#!/usr/bin/env bash
# Smoke test of a kvindex image (deploy/image/build.sh runs it before writing the archive).
# No container runtime: the image's root filesystem is mounted (`buildah from` + `buildah
# mount`, a writable layer as a container would have) and each binary runs from it with
# `chroot --userspec 65532:65532`, with a fresh /proc and the host's /dev as a runtime gives,
# and a clean environment. Checks:
# - the image's configuration: user 65532:65532, workdir /var/lib/kvindex, entrypoint kvindex,
#   the OCI labels version (= every binary's --version), revision and source;
# - no compiler, linker, make or cargo in it (by file name and by installed package), and every
#   binary's shared libraries resolve inside it (ldd);
# - `kvindex serve` with --snapshot-dir under /var/lib/kvindex answers /readyz, writes its
#   snapshot directory as 65532 and stops cleanly on SIGTERM; `kvindex-router` answers /healthz;
#   `kvindex-tokenizer`, with a small tokenizer preloaded, answers gRPC health (grpcio from the
#   venv of scripts/setup.sh) SERVING, for the server and for tokenization.TokenizationService
#   (the manifests' readiness probe);
# - its size.
# Usage: deploy/image/smoke.sh IMAGE   (root; buildah)
set -euo pipefail

image=${1:?usage: smoke.sh IMAGE}
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=scripts/env.sh
source "$here/../../scripts/env.sh"
python=$KVINDEX_PYTHON
[ -x "$python" ] || { echo "smoke: $python missing: run scripts/setup.sh (the venv with grpcio)" >&2; exit 1; }

fail() {
  echo "smoke: FAIL: $*" >&2
  exit 1
}

echo "== smoke test of $image"
version=$(buildah inspect --type image "$image" | "$python" -c '
import json, sys
c = json.load(sys.stdin)["OCIv1"]["config"]
labels = c.get("Labels") or {}
want = {"User": "65532:65532", "WorkingDir": "/var/lib/kvindex", "Entrypoint": ["kvindex"]}
bad = [f"{k} is {c.get(k)!r}, not {v!r}" for k, v in want.items() if c.get(k) != v]
bad += [f"label {k} missing" for k in ("version", "revision", "source")
        if not labels.get("org.opencontainers.image." + k)]
if bad:
    sys.exit("; ".join(bad))
print(labels["org.opencontainers.image.version"])
') || fail "the image's configuration"
echo "config: user 65532:65532, workdir /var/lib/kvindex, entrypoint kvindex, labels version $version, revision, source"

ctr=$(buildah from --pull=never "$image")
rootfs=$(buildah mount "$ctr")
logs=$(mktemp -d /var/tmp/kvindex-smoke.XXXXXX)
pids=()
mounted=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  local m still=()
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do
    m=${mounted[$i]}
    umount "$m" 2>/dev/null || umount -l "$m" || true
    ! mountpoint -q "$m" || still+=("$m")
  done
  rm -rf "$logs"
  # Removing the container deletes its tree: never while the host's /dev or /proc is inside.
  if [ ${#still[@]} -gt 0 ]; then
    echo "smoke: still mounted, container $ctr kept: ${still[*]}" >&2
    return
  fi
  buildah umount "$ctr" >/dev/null 2>&1 || true
  buildah rm "$ctr" >/dev/null 2>&1 || true
}
trap cleanup EXIT

# Build tools: executables (or links) by name anywhere in the image, toolchain directories, and
# Debian packages (gcc-12-base and libgcc-s1 are runtime libraries, not a compiler).
executables_named() {
  local expr=() n
  for n in "$@"; do expr+=(-o -name "$n"); done
  find "$rootfs" -xdev \( -false "${expr[@]}" \) \( -type f -perm /111 -o -type l \) -print
}
[ -n "$(executables_named kvindex-router)" ] || fail "the name search finds nothing at all (not even kvindex-router)"
tools=$(executables_named cargo rustc rustup cc c++ gcc 'gcc-[0-9]*' 'g++*' 'clang*' ld ld.bfd ld.gold ld.lld make cpp as)
tools+=$(find "$rootfs" -xdev -type d \( -name .cargo -o -name .rustup -o -name rustlib \) -print)
[ -z "$tools" ] || fail "build tools in the image: $tools"
packages=$(chroot "$rootfs" dpkg-query -W -f '${Package}\n' 2>/dev/null |
  grep -E '^(gcc|g\+\+|cpp|clang|llvm|rustc|cargo|make|build-essential|binutils)(-[0-9.]+)?$|^binutils-|-dev$' || true)
[ -z "$packages" ] || fail "build packages installed in the image: $packages"
echo "no compiler, linker, make or cargo (by file name and by package)"

for b in kvindex kvindex-router kvindex-tokenizer; do
  libs=$(chroot "$rootfs" /usr/bin/ldd "/usr/local/bin/$b") || fail "ldd $b"
  ! grep -q "not found" <<<"$libs" || fail "$b: libraries missing from the image: $(grep 'not found' <<<"$libs")"
  echo "$b: $(grep -c '=>' <<<"$libs") shared libraries, all in the image"
done

mount -t proc proc "$rootfs/proc" || mount --bind /proc "$rootfs/proc"
mounted+=("$rootfs/proc")
mount --bind /dev "$rootfs/dev"
mounted+=("$rootfs/dev")

# One of the image's binaries, as uid/gid 65532 with a container's clean environment (exec'd:
# env, then chroot, then the binary take the caller's process).
as_65532() {
  exec env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/var/lib/kvindex RUST_LOG=info \
    chroot --userspec 65532:65532 "$rootfs" "$@"
}
start() { # start NAME COMMAND...: in the background, output to $logs/NAME.log; $pid is the binary's
  local name=$1
  shift
  (as_65532 "$@") >"$logs/$name.log" 2>&1 &
  pid=$!
  pids+=("$pid")
}
free_port() {
  "$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
# wait_for WHAT PID COMMAND...: until COMMAND succeeds, failing (with the log) if PID exits or
# 120 s pass (a busy machine).
wait_for() {
  local what=$1 pid=$2 deadline=$((SECONDS + 120))
  shift 2
  until "$@" >/dev/null 2>&1; do
    kill -0 "$pid" 2>/dev/null || fail "$what: the process exited: $(cat "$logs"/*.log)"
    [ $SECONDS -lt $deadline ] || fail "$what: not within 120 s: $(cat "$logs"/*.log)"
    sleep 0.2
  done
}

for b in kvindex kvindex-router kvindex-tokenizer; do
  said=$(as_65532 "/usr/local/bin/$b" --version) || fail "$b --version" # $(...) is a subshell: exec is safe
  grep -qw -- "$version" <<<"$said" || fail "$b --version says $said, the label $version"
done
echo "--version of all three: $version, as the label"

# kvindex serve with snapshots under /var/lib/kvindex: ready, then a clean stop.
grpc=$(free_port)
http=$(free_port)
start kvindex /usr/local/bin/kvindex serve --grpc-addr "127.0.0.1:$grpc" --http-addr "127.0.0.1:$http" \
  --snapshot-dir /var/lib/kvindex/snapshots
indexer=$pid
wait_for "kvindex serve /readyz" "$indexer" curl -fsS "http://127.0.0.1:$http/readyz"
snapshots="$rootfs/var/lib/kvindex/snapshots"
[ "$(stat -c %u:%g "$snapshots")" = 65532:65532 ] || fail "$snapshots is $(stat -c %u:%g "$snapshots"), not 65532's"
kill -TERM "$indexer"
deadline=$((SECONDS + 120))
while kill -0 "$indexer" 2>/dev/null && [ $SECONDS -lt $deadline ]; do sleep 0.2; done
status=0
wait "$indexer" || status=$?
[ "$status" -eq 0 ] || fail "kvindex serve exited $status on SIGTERM: $(cat "$logs/kvindex.log")"
echo "kvindex serve: /readyz 200 as 65532, snapshot dir /var/lib/kvindex/snapshots ($(ls "$snapshots" | tr '\n' ' ')), exit 0 on SIGTERM"

router=$(free_port)
start kvindex-router /usr/local/bin/kvindex-router serve --http-addr "127.0.0.1:$router" --pod smoke=http://127.0.0.1:9
wait_for "kvindex-router /healthz" "$pid" curl -fsS "http://127.0.0.1:$router/healthz"
echo "kvindex-router: /healthz 200 as 65532"

# A small word-level tokenizer made with Hugging Face `tokenizers` (the venv's), where the
# manifests mount the tokenizer volume, preloaded as they do.
mkdir -p "$rootfs/tokenizers/smoke"
"$python" -c '
import sys
from tokenizers import Tokenizer, models, pre_tokenizers
t = Tokenizer(models.WordLevel({"[UNK]": 0, "hello": 1, "world": 2}, unk_token="[UNK]"))
t.pre_tokenizer = pre_tokenizers.Whitespace()
t.save(sys.argv[1])
' "$rootfs/tokenizers/smoke/tokenizer.json"
tgrpc=$(free_port)
tmetrics=$(free_port)
start kvindex-tokenizer /usr/local/bin/kvindex-tokenizer serve --grpc-addr "127.0.0.1:$tgrpc" --http-addr "127.0.0.1:$tmetrics" \
  --model smoke=/tokenizers/smoke --preload smoke
tokenizer=$pid
wait_for "kvindex-tokenizer /metrics" "$tokenizer" curl -fsS "http://127.0.0.1:$tmetrics/metrics"
"$python" "$here/grpc_health.py" "127.0.0.1:$tgrpc" "" tokenization.TokenizationService ||
  fail "kvindex-tokenizer gRPC health: $(cat "$logs/kvindex-tokenizer.log")"
echo "kvindex-tokenizer: a tokenizer preloaded, gRPC health SERVING (server, tokenization.TokenizationService) as 65532"

echo "smoke: PASS ($image: $(buildah images --format '{{.Size}}' "$image" | head -n 1))"
