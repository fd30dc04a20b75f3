"""The GPU checks of `vramscope attach` that need a real job (issue 29), for a
machine with CUDA, torch and a built vramscope binary:

    python3 python/gpu/live_oom_check.py path/to/vramscope OUT_DIR [--mode auto|agent|poll] [--record FILE]

1. Whether ``torch.cuda.memory._snapshot(include_traces=False)`` (and a full
   ``_snapshot()``) leaves a ``snapshot`` entry in the trace: the agent places
   the job's states in the entry stream by that entry.
2. A job (this file with ``--job``) serves a unix socket; ``vramscope attach
   SOCKET --json`` reads it headless while the job runs eight AdamW steps of a
   small MLP that keeps a 2 MiB tensor per step in a list (a leak), then
   allocates until PyTorch raises ``OutOfMemoryError`` under a 1 GiB memory
   fraction and lets it end the program. The report must flag the leak
   (+2 MiB per step), carry PyTorch's own OOM message (sent by the helper's
   excepthook), and hold NVML's reading of the job's process (read when the
   job says bye, while it still holds its memory).

It prints one JSON object with what it found and exits 1 when a check fails.
"""

import argparse
import atexit
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

MIB = 1 << 20


def snapshot_entries():
    import torch

    mem = torch.cuda.memory
    mem._record_memory_history(enabled="all", context="all", stacks="python", max_entries=10_000)
    x = torch.empty(MIB, device="cuda")
    del x
    try:
        mem._snapshot(include_traces=False)
        include_traces = True
    except TypeError:  # PyTorch before the include_traces argument
        include_traces = False
    mem._snapshot()
    snap = mem._snapshot()
    mem._record_memory_history(enabled=None)
    actions = [e.get("action") for e in snap["device_traces"][0]]
    return {
        "include_traces_supported": include_traces,
        "actions": actions,
        "snapshot_entries": actions.count("snapshot"),
        "note": "_snapshot() called %d time(s) before the one read" % (2 if include_traces else 1),
    }


def job(sock, mode, go, record=None):
    # Registered before vramscope_live's own atexit stop, so it runs after it:
    # the process says bye and then lives on a moment, holding its memory,
    # while attach reads NVML.
    atexit.register(lambda: time.sleep(3))
    import torch

    import vramscope_live

    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction((1 << 30) / total)
    vramscope_live.start(sock, mode=mode, record_to=record)
    deadline = time.time() + 60
    while not os.path.exists(go) and time.time() < deadline:
        time.sleep(0.01)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10)).cuda()
    opt = torch.optim.AdamW(model.parameters())
    kept = []
    for _ in range(8):
        x = torch.randn(64, 1024, device="cuda")
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        kept.append(torch.empty(MIB // 2, device="cuda"))  # 2 MiB a step, never freed
        time.sleep(0.15)  # the helper reads memory_stats() at most 10 times a second
    hoard = []
    while True:  # ends the program with PyTorch's OutOfMemoryError
        hoard.append(torch.empty(64 * MIB // 4, device="cuda"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("vramscope")
    ap.add_argument("out")
    ap.add_argument("--mode", default="auto", choices=["auto", "agent", "poll"])
    ap.add_argument("--job", nargs=2, metavar=("SOCKET", "GO_FILE"))
    ap.add_argument("--record", metavar="FILE", help="the job also records its stream (record_to=FILE)")
    args = ap.parse_args()
    if args.job:
        job(args.job[0], args.mode, args.job[1], args.record)
        return
    os.makedirs(args.out, exist_ok=True)
    found = {"include_traces": snapshot_entries()}

    sock = os.path.join(args.out, "oom.sock")
    go = os.path.join(args.out, "oom.go")
    for p in (sock, go):
        if os.path.exists(p):
            os.remove(p)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), args.vramscope, args.out, "--mode", args.mode, "--job", sock, go]
        + (["--record", args.record] if args.record else []),
        stderr=subprocess.PIPE, text=True, env=env,
    )
    job_err = []
    for line in proc.stderr:
        job_err.append(line)
        if line.startswith("vramscope attach "):
            break
    attach = subprocess.Popen([args.vramscope, "attach", sock, "--json"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    time.sleep(0.5)
    open(go, "w").close()
    job_err.extend(proc.stderr)
    proc.wait(timeout=120)
    out, err = attach.communicate(timeout=60)
    report = json.loads(out) if attach.returncode == 0 and out.strip() else None
    live = report["live"] if report else {}
    ooms = live.get("ooms", [])
    growth = live.get("growth", [])
    found.update({
        "job_exit": proc.returncode,
        "job_stderr_tail": "".join(job_err)[-3000:],
        "attach_exit": attach.returncode,
        "attach_stderr": err[-2000:],
        "mode": live.get("mode"),
        "steps_seen": live.get("steps_seen"),
        "growth_per_step": [g.get("growth_per_step") for g in growth],
        "ooms": ooms,
        "nvml": live.get("nvml"),
        "lost": live.get("lost"),
        "started_over": live.get("started_over"),
        "ended": live.get("ended"),
        "leaks": [d.get("leaks") for d in report["devices"]] if report else None,
    })
    print(json.dumps(found, indent=1, default=str))
    two_mib = [g for g in found["growth_per_step"] if g and sum(1 for d in g if d >= 2 * MIB) >= 5]
    ok = (
        report is not None
        and any("out of memory" in (o.get("pytorch_message") or "").lower() for o in ooms)
        and bool(live.get("nvml"))
        and bool(two_mib)
    )
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
