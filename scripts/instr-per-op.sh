#!/usr/bin/env bash
# Instructions per operation of one `profile_op` operation, counted by callgrind: the
# difference of a run of N operations and one of 2N, divided by N, so that setup
# (pool pre-faulting, the prefilled file) cancels. Deterministic where this host's
# times drift by more than most changes; it cannot see cache misses or fences.
#
#   scripts/instr-per-op.sh OP [N] [PAGES] [BINARY]
#
# OP: a `profile_op` operation (randwrite64, rewrite64, append64, randwrite4k, ...);
# N: operations (default 100000); PAGES: FERRITE_PROFILE_PAGES, the random writes'
# span (default 512: a 64 B random write's page merges every 33 writes within the
# run); BINARY: a `profile_op` build (default: this checkout's, built here).
# valgrind has no AVX-512: copies and checksums run their SSE paths under it.
set -euo pipefail
cd "$(dirname "$0")/.."
op=${1:?usage: scripts/instr-per-op.sh OP [N] [PAGES] [BINARY]}
n=${2:-100000}
pages=${3:-512}
bin=${4:-}
if ! command -v valgrind >/dev/null; then
  apt-get install -y -q valgrind >/dev/null
fi
if [ -z "$bin" ]; then
  cargo build --release -q -p ferrite-bench --example profile_op
  bin="${CARGO_TARGET_DIR:-target}/release/examples/profile_op"
fi
count() {
  local out
  out=$(mktemp)
  FERRITE_PROFILE_POOL_MB=512 FERRITE_PROFILE_PAGES="$pages" FERRITE_PROFILE_OPS="$1" \
    valgrind --tool=callgrind --callgrind-out-file="$out" "$bin" "$op" 100000 2>&1 |
    sed -n 's/.*I *refs: *//p' | tr -d ,
  rm -f "$out"
}
a=$(count "$n")
b=$(count $((2 * n)))
echo "$op: $(((b - a) / n)) instructions per operation ($n operations, span $pages pages)"
