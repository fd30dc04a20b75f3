#!/usr/bin/env bash
# `vramscope watch` in a real terminal on a real card (issue 24's owed check):
# a PyTorch process holding 1 GiB, the TUI in tmux, the screen captured.
#
#   bash python/gpu/watch_tui.sh VRAMSCOPE_BINARY OUT_DIR [COLUMNS ROWS]
set -u
bin="$(readlink -f "$1")"
out="$2"
cols="${3:-120}"
rows="${4:-40}"
command -v tmux >/dev/null || { echo "watch_tui.sh: no tmux here"; exit 0; }
python3 -c "import torch, time; x = torch.empty(2**28, device='cuda'); time.sleep(12)" &
job=$!
sleep 4
tmux new-session -d -s w -x "$cols" -y "$rows" "$bin watch"
sleep 3
tmux capture-pane -p -t w >"$out/watch-${cols}x${rows}.txt"
tmux send-keys -t w q
sleep 0.5
tmux kill-server 2>/dev/null
wait "$job"
exit 0
