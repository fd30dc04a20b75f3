#!/usr/bin/env bash
# `vramscope attach` in a real terminal on a real job (issue 29): the job of
# live_oom_check.py (AdamW steps keeping 2 MiB each, then an OOM) served on
# a unix socket, the TUI in tmux (200x60 unless named), the screen captured
# each second.
#
#   bash python/gpu/live_tui.sh VRAMSCOPE_BINARY OUT_DIR [COLUMNS ROWS]
set -u
bin="$(readlink -f "$1")"
out="$2"
cols="${3:-200}"
rows="${4:-60}"
command -v tmux >/dev/null || { echo "live_tui.sh: no tmux here"; exit 0; }
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
sock=/tmp/vs-tui.sock
go=/tmp/vs-tui.go
rm -f "$sock" "$go"
python3 "$here/live_oom_check.py" "$bin" /tmp/vs-tui --job "$sock" "$go" 2>/tmp/vs-tui-job.err &
job=$!
# start() builds the agent first on a fresh machine (about 20 s)
for _ in $(seq 1200); do [ -S "$sock" ] && break; sleep 0.1; done
tmux new-session -d -s vs -x "$cols" -y "$rows" "$bin attach $sock"
sleep 1
tmux capture-pane -p -t vs >"$out/tui-${cols}x${rows}-0.txt"
touch "$go"
for i in 1 2 3 4 5 6; do
    sleep 1
    tmux capture-pane -p -t vs >"$out/tui-${cols}x${rows}-$i.txt"
done
tmux send-keys -t vs q
wait "$job"
tail -5 /tmp/vs-tui-job.err
tmux kill-server 2>/dev/null
exit 0
