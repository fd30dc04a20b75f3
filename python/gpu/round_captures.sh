#!/usr/bin/env bash
# One device run for the GPU checks of issues 38, 39 and 42 (2026-12-05):
#
#   bash python/gpu/round_captures.sh OUT_DIR [GPU_KERNELS_TEST_BINARY]
#
# 1. the capture programs that await a capture (capture.sh's awaiting list)
#    and the new ones named in NEW below, four at a time;
# 2. python/gpu/holders_job.py under `python -m vramscope_live --record`,
#    in poll mode and in agent mode (the agent builds with the GPU's torch);
# 3. the cudarc/NVRTC kernel tests (tests/gpu_kernels.rs), from a test
#    binary built elsewhere, when one is given.
# OUT_DIR gets run.log and results.tar.gz (captures, recordings, logs).

set -u
out="$(readlink -f "$1")"
kernels="${2:-}"
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
work=/tmp/vs-round
rm -rf "$work"
mkdir -p "$work/captured" "$work/live" "$out"
export PYTHONUNBUFFERED=1 TORCH_EXTENSIONS_DIR=/tmp/vs-torch-ext
cd "$repo" || exit 1
t0=$SECONDS
step() { echo; echo "=== [$((SECONDS - t0)) s] $*"; }
NEW=(handwritten_transformer moe_small)

step machine
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'

export PYTHONPATH="$repo/python${PYTHONPATH:+:$PYTHONPATH}"
step "holders job, poll and agent, beside the captures"
for mode in poll agent; do
    ( cd "$work/live" && timeout 240 python3 -m vramscope_live --mode "$mode" \
        --record "$work/live/holders-job-h100-$mode.vslive" "$repo/python/gpu/holders_job.py" \
        >"$work/live/holders-$mode.log" 2>&1; echo "exit $?" >>"$work/live/holders-$mode.log" ) &
done

programs=($(sed -n 's/^awaiting=(\(.*\))$/\1/p' tests/fixtures/pytorch/capture.sh) "${NEW[@]}")
echo "${#programs[@]} programs: ${programs[*]}"
for g in 0 1 2 3; do
    mine=()
    for i in "${!programs[@]}"; do
        [ $((i % 4)) -eq "$g" ] && mine+=("${programs[$i]}")
    done
    [ "${#mine[@]}" -gt 0 ] || continue
    CAPTURE_DIR="$work/captured" timeout 300 bash tests/fixtures/pytorch/capture.sh "${mine[@]}" \
        >"$work/capture-$g.log" 2>&1 &
done

if [ -n "$kernels" ]; then
    step "kernel tests"
    chmod +x "$kernels"
    timeout 120 "$kernels" --ignored --test-threads 1 2>&1 | tee "$work/gpu_kernels.log" | tail -15
fi
wait
step "captures"
grep -h -- "^-- \|FAILED\|peak allocated" "$work"/capture-*.log
step "holders"
tail -n 5 "$work"/live/holders-*.log
ls -la "$work/live" "$work/captured"
tar czf "$out/results.tar.gz" -C "$work" . && ls -la "$out"
step done
