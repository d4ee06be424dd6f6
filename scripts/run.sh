#!/usr/bin/env bash
# Build FerriteFS, format a pool under /dev/shm (once) and mount it at $FERRITE_MNT
# (default /mnt/ferrite). Until a mount is possible here, runs a short demo on the pool.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cargo build --release -q -p ferrite-cli -p ferrite-preload -p ferrite-capi
# Where cargo put the build (CARGO_TARGET_DIR, when the environment sets it).
F=${CARGO_TARGET_DIR:-target}/release/ferrite
POOL=${FERRITE_POOL:-/dev/shm/ferrite.pool}
MNT=${FERRITE_MNT:-/mnt/ferrite}
SIZE=${FERRITE_SIZE:-1G}
if grep -q " $MNT " /proc/mounts; then
  echo "already mounted at $MNT (unmount with: $F umount $MNT)"
  df -h "$MNT"
  exit 0
fi
if [ ! -e "$POOL" ]; then
  $F mkfs "$POOL" --size "$SIZE"
else
  # A pool made by an earlier build (format version 1) is converted in place.
  $F upgrade "$POOL"
fi
$F info "$POOL"
if $F help mount >/dev/null 2>&1 && [ -e /dev/fuse ]; then
  mkdir -p "$MNT"
  $F mount "$POOL" "$MNT"
  echo "mounted $POOL at $MNT; unmount with: $F umount $MNT"
  echo "run a program with direct access: $F run -- CMD"
  df -h "$MNT"
else
  echo "--- demo: import this source tree, check it, export it back, compare ---"
  $F rm --pool "$POOL" /demo 2>/dev/null || true
  $F import --pool "$POOL" crates /demo/crates
  $F ls --pool "$POOL" -l /demo/crates
  tmp=$(mktemp -d)
  $F export --pool "$POOL" /demo/crates "$tmp/crates"
  diff -r crates "$tmp/crates" && echo "round trip: identical"
  rm -rf "$tmp"
  $F fsck "$POOL"
fi
