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
