#!/usr/bin/env bash
# `vramscope diff A B` on two large snapshots: wall time and peak RSS (the
# issue's figure: two 1 GB files in at most 10 s and 2 GB). By default the
# 1.05 GB file `cargo bench --bench open` generates, against a second copy of
# it (A is reduced to its live blocks and dropped before B is read). Three runs.
#
#   cargo build --release && benches/diff_large.sh [A B]
set -u
bin=${VRAMSCOPE:-target/release/vramscope}
tmp=${TMPDIR:-/tmp}
a=${1:-$tmp/vramscope-synth-1050000000-1.pickle}
b=${2:-$a}
[ -x "$bin" ] || { echo "build first: cargo build --release" >&2; exit 1; }
[ -f "$a" ] && [ -f "$b" ] || { echo "$a or $b not found (run cargo bench --bench open)" >&2; exit 1; }
command -v /usr/bin/time >/dev/null || { echo "needs /usr/bin/time" >&2; exit 1; }
for run in 1 2 3; do
  /usr/bin/time -f "%e s wall, %M KiB peak RSS" "$bin" diff "$a" "$b" 2>&1 >/dev/null | tail -1 |
    sed "s|^|diff run $run: |"
done
