"""The GPU check of `vramscope attach` (issue 29), for a machine with CUDA,
torch and a built vramscope binary:

    python3 python/gpu/live_check.py path/to/vramscope OUT_DIR [--mode agent|poll] [--steps 30] [--no-stacks]

A GPT-2-small training loop (12 layers, width 768, 12 heads, 1,024 tokens,
batch 4, AdamW, PyTorch's defaults otherwise):

1. steps without the helper: the median step time;
2. the same steps with ``vramscope_live.start(mode=MODE, record_to=...)``: the
   median step time, so the helper's overhead, and the entries per step;
3. ``stop()`` sends a last ``resync`` state, a ``_snapshot()`` taken at that
   moment; ``vramscope attach --replay`` rebuilds the allocator's map from
   the stream and compares it with every state the job sent, block for
   block: ``started_over`` must be empty (a difference starts the view over
   and says why), and ``lost`` too.

4. a loop that only allocates and frees (cached 1 KiB blocks, 2 events an
   iteration, the GPU idle) with and without the helper: what the helper
   adds to each allocator event on the CPU.

It prints one JSON object with the figures and exits 1 when a check fails.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import vramscope_live  # noqa: E402


def gpt2_small(torch, vocab=50257, ctx=1024, width=768, layers=12, heads=12):
    nn = torch.nn
    F = torch.nn.functional

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1 = nn.LayerNorm(width)
            self.qkv = nn.Linear(width, 3 * width)
            self.proj = nn.Linear(width, width)
            self.ln_2 = nn.LayerNorm(width)
            self.fc = nn.Linear(width, 4 * width)
            self.fc_proj = nn.Linear(4 * width, width)

        def forward(self, x):
            b, t, c = x.shape
            q, k, v = self.qkv(self.ln_1(x)).split(c, dim=2)
            shape = (b, t, heads, c // heads)
            q, k, v = (z.view(shape).transpose(1, 2) for z in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
            return x + self.fc_proj(F.gelu(self.fc(self.ln_2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(vocab, width)
            self.wpe = nn.Embedding(ctx, width)
            self.h = nn.ModuleList(Block() for _ in range(layers))
            self.ln_f = nn.LayerNorm(width)
            self.lm_head = nn.Linear(width, vocab, bias=False)
            self.lm_head.weight = self.wte.weight

        def forward(self, idx):
            pos = torch.arange(idx.shape[1], device=idx.device)
            x = self.wte(idx) + self.wpe(pos)
            for block in self.h:
                x = block(x)
            return self.lm_head(self.ln_f(x))

    return GPT()


def steps(torch, model, opt, batches, n):
    times = []
    for i in range(n):
        x, y = batches[i % len(batches)]
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        logits = model(x)
        loss = torch.nn.functional.cross_entropy(logits.view(-1, logits.shape[-1]), y.view(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return times


def per_event_s(torch, n):
    """Seconds per allocator event of a CPU-bound loop: n cached 1 KiB
    allocations and frees (2 n events), the GPU idle."""
    dev = torch.device("cuda")
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        x = torch.empty(256, device=dev)
        del x
    return (time.perf_counter() - t0) / (2 * n)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("vramscope")
    ap.add_argument("out")
    ap.add_argument("--mode", default="agent", choices=["agent", "poll"])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--no-stacks", action="store_true", help="start(stacks=False): no Python stacks per entry")
    args = ap.parse_args()
    import torch

    os.makedirs(args.out, exist_ok=True)
    dev = torch.device("cuda")
    torch.manual_seed(0)
    model = gpt2_small(torch).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batches = [
        (torch.randint(0, 50257, (args.batch, 1024), device=dev),
         torch.randint(0, 50257, (args.batch, 1024), device=dev))
        for _ in range(4)
    ]
    steps(torch, model, opt, batches, 5)  # warm up: Adam's state, cuBLAS, the caching allocator
    plain = steps(torch, model, opt, batches, args.steps)

    label = args.mode + ("-nostacks" if args.no_stacks else "")
    rec = os.path.join(args.out, f"gpt2-{label}.vslive")
    sock = os.path.join(args.out, "job.sock")
    t0 = time.perf_counter()
    vramscope_live.start(sock, mode=args.mode, record_to=rec, stacks=not args.no_stacks)
    started_s = time.perf_counter() - t0
    live = steps(torch, model, opt, batches, args.steps)
    t0 = time.perf_counter()
    vramscope_live.stop("the check is done")
    stopped_s = time.perf_counter() - t0

    # The callback's cost alone: a loop that does nothing but allocate and
    # free (cached blocks, no kernels), with and without the helper.
    n = 100_000 if args.mode == "agent" else 20_000  # poll: every poll re-reads the whole ring
    per_event_s(torch, 1000)
    bare = min(per_event_s(torch, n) for _ in range(3))
    vramscope_live.start(os.path.join(args.out, "bench.sock"), mode=args.mode, stacks=not args.no_stacks,
                         record_to=os.path.join(args.out, f"bench-{label}.vslive"))
    helped = min(per_event_s(torch, n) for _ in range(3))
    vramscope_live.stop("the micro-benchmark is done")

    out = subprocess.run([args.vramscope, "attach", "--replay", rec, "--json"], capture_output=True, text=True)
    report = json.loads(out.stdout) if out.returncode == 0 else None
    facts = report["live"] if report else {}
    entries = sum(d.get("trace_entries", 0) for d in report["devices"]) if report else None
    summary = {
        "device": torch.cuda.get_device_name(dev),
        "torch": torch.__version__,
        "mode": facts.get("mode"),
        "mode_asked": args.mode,
        "stacks": facts.get("stacks"),
        "steps": args.steps,
        "median_step_s_without": statistics.median(plain),
        "median_step_s_with": statistics.median(live),
        "overhead": statistics.median(live) / statistics.median(plain) - 1,
        "overhead_per_entry_us": (
            (statistics.median(live) - statistics.median(plain)) * 1e6 * max(1, facts.get("steps_seen", 0)) / entries
            if entries else None
        ),
        "entries": entries,
        "entries_per_step": entries / max(1, facts.get("steps_seen", 0)) if entries else None,
        "alloc_free_loop_us_per_event_without": bare * 1e6,
        "alloc_free_loop_us_per_event_with": helped * 1e6,
        "helper_us_per_event": (helped - bare) * 1e6,
        "start_s": started_s,
        "stop_s": stopped_s,
        "recording_bytes": os.path.getsize(rec),
        "steps_seen": facts.get("steps_seen"),
        "started_over": facts.get("started_over"),
        "lost": facts.get("lost"),
        "ended": facts.get("ended"),
        "attach_error": None if report else out.stderr[-2000:],
    }
    print(json.dumps(summary, indent=1))
    ok = report is not None and not facts.get("started_over") and not facts.get("lost")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
