#!/usr/bin/env bash
# Opening a snapshot in the real TUI, as a user sees it: from launch in a
# 200x60 tmux pane to the first frame with map and timeline, to the first
# segments on the map, and to "all read" on the status line; with the CPU
# time and peak RSS of the process. The files are the ones `cargo bench
# --bench open` generates (run it first). Three runs per file.
#
#   cargo build --release && benches/open_in_tmux.sh [FILE...]
set -u
bin=${VRAMSCOPE:-target/release/vramscope}
tmp=${TMPDIR:-/tmp}
files=("$@")
[ ${#files[@]} -gt 0 ] || files=("$tmp"/vramscope-synth-82000000-1.pickle "$tmp"/vramscope-synth-1050000000-1.pickle)
command -v tmux >/dev/null || { echo "needs tmux" >&2; exit 1; }
[ -x "$bin" ] || { echo "build first: cargo build --release" >&2; exit 1; }
now() { date +%s%N; }
for f in "${files[@]}"; do
  [ -f "$f" ] || { echo "$f: not found (run cargo bench --bench open)" >&2; continue; }
  for run in 1 2 3; do
    session=vramscope-open-$$
    start=$(now)
    tmux -L vsopen new-session -d -s "$session" -x 200 -y 60 "$bin open '$f'"
    first="" seg="" done="" pid=""
    for _ in $(seq 1 1200); do
      s=$(tmux -L vsopen capture-pane -pt "$session" 2>/dev/null)
      t=$(( ($(now) - start) / 1000000 ))
      [ -n "$pid" ] || pid=$(pgrep -f "^$bin open $f" | head -1)
      if [ -z "$first" ] && [[ "$s" == *Timeline* && "$s" == *"Memory map"* ]]; then first=$t; fi
      if [ -z "$seg" ] && [[ "$s" == *"pool ·"* ]]; then seg=$t; fi
      if [[ "$s" == *"all read"* ]]; then done=$t; break; fi
      sleep 0.05
    done
    hwm=$(awk '/VmHWM/ {print $2}' "/proc/$pid/status" 2>/dev/null)
    cpu=$(awk '{printf "%.2f", ($14 + $15) / 100}' "/proc/$pid/stat" 2>/dev/null)
    tmux -L vsopen kill-session -t "$session"
    size=$(stat -c %s "$f")
    echo "$(basename "$f"): first frame ${first} ms, first segments ${seg} ms, all read ${done} ms," \
      "cpu ${cpu} s, peak RSS $((hwm / 1024)) MiB = $(awk "BEGIN {printf \"%.2f\", $hwm * 1024 / $size}")x the file"
  done
done
