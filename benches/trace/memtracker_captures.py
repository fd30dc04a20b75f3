"""MemTracker beside vramscope on the capture programs (issue 38).

    python benches/trace/memtracker_captures.py VRAMSCOPE PYTHON [PROGRAM...]

For every program of tests/trace/captures_table.in (or those named), runs

    VRAMSCOPE trace --json --steps 0 -- PYTHON benches/trace/memtracker_run.py PROGRAM OUT.pickle

two at a time, and prints one JSON line per program (its H100 peak
allocated from captured/PROGRAM.json, vramscope's traced peak and
MemTracker's estimate, in bytes; the run's wall time) and, at the end, the
table rows docs/trace.md carries. MemTracker runs inside the trace (see
memtracker_run.py): the same ops, the peer's own count of them.
"""

import concurrent.futures
import json
import os
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
FIXTURES = os.path.join(ROOT, "tests", "fixtures", "pytorch")
RUNNER = os.path.join(ROOT, "benches", "trace", "memtracker_run.py")


def programs():
    table = open(os.path.join(ROOT, "tests", "trace", "captures_table.in")).read()
    return re.findall(r'^\s*\("([a-z0-9_]+)",', table, re.M)


def one(vramscope, python, program, scratch):
    out = os.path.join(scratch, program + ".pickle")
    t = time.perf_counter()
    r = subprocess.run(
        [vramscope, "trace", "--json", "--steps", "0", "--", python, RUNNER,
         os.path.join(FIXTURES, program + ".py"), out],
        stdin=subprocess.DEVNULL, capture_output=True, text=True,
    )
    wall = time.perf_counter() - t
    real = json.load(open(os.path.join(FIXTURES, "captured", program + ".json")))
    row = {"program": program, "real": real["max_memory_allocated"], "wall_s": round(wall, 1)}
    mt = [l for l in r.stderr.splitlines() if l.startswith("MEMTRACKER ")]
    row["memtracker"] = json.loads(mt[-1][len("MEMTRACKER "):])["peak"] if mt else None
    try:
        row["traced"] = json.load(open(out[: -len(".pickle")] + ".json"))["max_memory_allocated"]
    except (OSError, ValueError, KeyError):
        row["traced"] = None
    if row["memtracker"] is None or row["traced"] is None:
        # The program did not finish under MemTracker: its last words.
        row["error"] = [l for l in r.stderr.strip().splitlines() if "Error" in l][-1:]
    return row


def cell(r):
    """MemTracker's estimate against the H100's peak, or why there is none:
    the program failed under it, or ran otherwise with it (its own peak,
    which the trace measures under MemTracker too, left the capture's)."""
    if r["traced"] is None or r["memtracker"] is None:
        return "fails under MemTracker: " + " ".join(r.get("error") or ["(no JSON written)"])
    d = r["memtracker"] - r["real"]
    text = f"{d / 2**20:+.2f} MiB ({d / r['real'] * 100:+.2f} %)"
    if abs(r["traced"] - r["real"]) > r["real"] // 100:
        text += f"; the program's own peak under MemTracker is {r['traced']:,} B (its hooks keep memory alive)"
    return text


def main():
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    vramscope, python = sys.argv[1], sys.argv[2]
    wanted = sys.argv[3:] or programs()
    rows = []
    with tempfile.TemporaryDirectory(prefix="vramscope-memtracker-") as scratch:
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            for row in pool.map(lambda p: one(vramscope, python, p, scratch), wanted):
                print(json.dumps(row), flush=True)
                rows.append(row)
    print("\n| program | real peak allocated (B) | MemTracker Δ allocated |")
    print("|---|---|---|")
    for r in rows:
        print(f"| `{r['program']}` | {r['real']:,} | {cell(r)} |")


if __name__ == "__main__":
    main()
