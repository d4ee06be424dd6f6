#!/usr/bin/env bash
# Install what the tests need, then check formatting, lints and run every test.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -q -- -D warnings
# The preload library and libferrite are loaded by the tests from beside the
# `ferrite` binary: build every crate (cdylibs included) first.
cargo build --workspace -q
cargo test --workspace --no-fail-fast 2>&1 | tee /tmp/ferrite-test.log
# fuser, vendored with the io_uring transport (vendor/fuser/FERRITE.md): its own unit
# tests, on its own lock file (it is not a workspace member).
cargo test -q --locked --manifest-path vendor/fuser/Cargo.toml --lib \
  --target-dir "${CARGO_TARGET_DIR:-target}/vendor-fuser"
