#!/usr/bin/env bash
# Install what the tests need, then check formatting, lints and run every test.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -q -- -D warnings
cargo test --workspace --no-fail-fast 2>&1 | tee /tmp/ferrite-test.log
