#!/usr/bin/env bash
# Every check that needs an NVIDIA GPU, in one run (issues 24 and 29), for a
# lent machine with CUDA and PyTorch:
#
#   bash python/gpu/device_run.sh VRAMSCOPE_BINARY OUT_DIR [CAPTURE_PROGRAM ...]
#
# 1. the card's facts (a GPU profile's numbers): name, memory, SMs, L2, the
#    CUDA context's footprint by NVML, PCI bus id and UUID;
# 2. the awaiting captures (tests/fixtures/pytorch/capture.sh), four at a
#    time, while the live helper's C++ agent builds;
# 3. python/gpu/live_check.py: agent with stacks, agent without, poll;
# 4. python/gpu/live_oom_check.py: PyTorch's OOM message, NVML, a leak;
# 5. `vramscope run NAME --device cuda` (cudarc backend, NVML) and `watch --once --json`.
#
# Each step has its own time limit and the run goes on past a failed step.
# OUT_DIR gets run.log, results.tar.gz (the step outputs) and
# captures.tar.gz (the captured pickles and JSON), split in 15 MB parts if
# larger.

set -u
bin="$(readlink -f "$1")"
out="$2"
shift 2
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
work=/tmp/vs-work
cap=/tmp/vs-capture
rm -rf "$work" "$cap"
mkdir -p "$work" "$cap" "$out"
export PYTHONUNBUFFERED=1
export TORCH_EXTENSIONS_DIR=/tmp/vs-torch-ext
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
cd "$repo" || exit 1
t0=$SECONDS
# The whole run ends within DEVICE_RUN_SECONDS (default 500): each step's
# limit is cut to what is left, less 20 s for packing the results.
deadline=$((t0 + ${DEVICE_RUN_SECONDS:-500}))
step() { echo; echo "=== [$((SECONDS - t0)) s] $*"; }
# limit WANTED: the step's time limit, at most what is left
limit() {
    local left=$((deadline - SECONDS - 20))
    [ "$left" -lt "$1" ] && echo "$left" || echo "$1"
}

pack() {
    tar czf "$out/results.tar.gz" -C "$work" . 2>/dev/null
}

step "machine"
nvidia-smi --query-gpu=name,memory.total,memory.used,pci.bus_id,uuid,driver_version --format=csv 2>&1 | tee "$work/nvidia-smi.csv"
python3 - <<'EOF' 2>&1 | tee "$work/profile.json"
import json, os, subprocess, torch
def nvml_used():
    q = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                       capture_output=True, text=True).stdout
    for line in q.splitlines():
        pid, used = [x.strip() for x in line.split(",")]
        if int(pid) == os.getpid():
            return int(used) * 2**20
    return None
free0, total = torch.cuda.mem_get_info()
p = torch.cuda.get_device_properties(0)
facts = {
    "torch": torch.__version__, "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
    "name": p.name, "total_memory": p.total_memory, "sms": p.multi_processor_count,
    "l2_cache_size": getattr(p, "L2_cache_size", None), "cc": [p.major, p.minor],
    "pci": [getattr(p, "pci_domain_id", None), getattr(p, "pci_bus_id", None), getattr(p, "pci_device_id", None)],
    "uuid": str(getattr(p, "uuid", "")),
    "context_nvml_after_init": nvml_used(), "mem_get_info_after_init": [free0, total],
}
a = torch.randn(1024, 1024, device="cuda"); (a @ a).sum().item()
facts["nvml_after_matmul"] = nvml_used()
facts["reserved_after_matmul"] = torch.cuda.memory_reserved()
print(json.dumps(facts, indent=1))
EOF
pack

step "captures (4 at a time) while the agent builds"
( timeout "$(limit 240)" python3 - >"$work/agent_build.log" 2>&1 <<EOF
import sys, time, traceback
sys.path.insert(0, "$repo/python")
import torch, vramscope_live
t = time.time()
try:
    vramscope_live._build_agent(torch)
    print("agent built in %.1f s" % (time.time() - t))
except Exception:
    traceback.print_exc()
    print("agent build FAILED after %.1f s" % (time.time() - t))
EOF
) &
build=$!
if [ "$#" -gt 0 ]; then
    programs=("$@")
else
    programs=()
    for p in $(sed -n 's/^programs=(\(.*\))$/\1/p' tests/fixtures/pytorch/capture.sh); do
        [ -f "tests/fixtures/pytorch/captured/$p.json" ] || programs+=("$p")
    done
fi
echo "${#programs[@]} programs: ${programs[*]}"
groups=4
for g in $(seq 0 $((groups - 1))); do
    mine=()
    for i in "${!programs[@]}"; do
        [ $((i % groups)) -eq "$g" ] && mine+=("${programs[$i]}")
    done
    [ "${#mine[@]}" -gt 0 ] || continue
    CAPTURE_DIR="$cap" timeout "$(limit 220)" bash tests/fixtures/pytorch/capture.sh "${mine[@]}" >"$work/capture-$g.log" 2>&1 &
done
wait
grep -h -- "^-- \|FAILED" "$work"/capture-*.log
cat "$work/agent_build.log" | tail -40
tar czf "$work/../vs-captures.tar.gz" -C "$cap" . && ls -la "$work/../vs-captures.tar.gz"
size=$(stat -c %s "$work/../vs-captures.tar.gz")
if [ "$size" -gt $((15 * 1024 * 1024)) ]; then
    split -b 15m "$work/../vs-captures.tar.gz" "$out/captures.tar.gz.part-"
else
    cp "$work/../vs-captures.tar.gz" "$out/captures.tar.gz"
fi
pack

lc=/tmp/vs-lc
mkdir -p "$lc"
for args in "--mode agent" "--mode agent --no-stacks" "--mode poll"; do
    step "live_check $args"
    timeout "$(limit 100)" python3 python/gpu/live_check.py "$bin" "$lc" $args 2>&1 | tee "$work/live_check $args.log" | tail -40
    pack
done
cp "$lc"/*.vslive "$work/" 2>/dev/null

step "live_oom_check"
timeout "$(limit 90)" python3 python/gpu/live_oom_check.py "$bin" /tmp/vs-oom 2>&1 | tee "$work/live_oom_check.log" | tail -80
pack

for name in zero-grad-fixed gpt2-small-fits; do
    step "run $name --device cuda"
    timeout "$(limit 60)" "$bin" run "$name" --device cuda --json >"$work/run-$name-cuda.json" 2>"$work/run-$name-cuda.err"
    echo "exit $?"
    tail -5 "$work/run-$name-cuda.err"
    timeout "$(limit 60)" "$bin" run "$name" --device cuda --headless 2>&1 | head -30 | tee "$work/run-$name-cuda.txt"
done
pack

step "watch --once --json"
timeout 20 "$bin" watch --once --json 2>&1 | tee "$work/watch.json" | head -c 3000
echo
CUDA_VISIBLE_DEVICES=0 timeout 20 "$bin" run zero-grad-fixed --device cuda:0 --headless 2>&1 | grep -i "run on\|NVML\|kernels" | tee "$work/visible-devices.txt"
pack
step "done"
