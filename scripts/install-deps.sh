#!/usr/bin/env bash
# Install what FerriteFS needs on a fresh Debian machine: the Rust toolchain's
# components and the Debian packages listed in scripts/apt-packages.txt.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
pkgs=$(grep -v '^#' "$here/apt-packages.txt" | grep -v '^\s*$' | tr '\n' ' ')
missing=""
for p in $pkgs; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq >/dev/null
  $SUDO apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi
if ! command -v cargo >/dev/null; then
  echo "cargo not found: install Rust (rustup) first" >&2
  exit 1
fi
rustup component add clippy rustfmt >/dev/null 2>&1 || true
# FUSE over io_uring (Linux 6.14+): turn the fuse module's switch on when the kernel
# has it and we may, so `ferrite mount` serves requests over io_uring (docs/FUSE.md,
# "FUSE over io_uring"). It only lets FUSE daemons that ask for it use io_uring.
uring=/sys/module/fuse/parameters/enable_uring
if [ -w "$uring" ] && ! grep -qE '^(Y|1)' "$uring"; then
  echo 1 > "$uring" || true
fi
