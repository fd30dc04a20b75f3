"""A stand-in training job for end-to-end tests of `vramscope attach`: the
helper (poll mode) serves a job the stand-in torch plays from a real
snapshot, the way a user's job would run it.

    python3 python/tests/live_job.py SNAPSHOT ADDRESS [--token T] [--no-mark-step] [--poll N] [--pause-ms MS]

It plays 3 entries, calls start(ADDRESS), then waits for a line on stdin
(the test sends one once `vramscope attached` is on stderr), plays the rest
of the trace in polls of N entries (5) with a mark_step() after the first two
polls (unless --no-mark-step: then the steps are the file's own
Optimizer.step annotations, through the step hook), and stops with "the job
finished".
"""

import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "fake_torch"))
sys.path.insert(0, os.path.dirname(HERE))

import fake_torch  # noqa: E402
import vramscope_live  # noqa: E402


def main():
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("snapshot")
    ap.add_argument("address")
    ap.add_argument("--token")
    ap.add_argument("--no-mark-step", action="store_true")
    ap.add_argument("--poll", type=int, default=5)
    # A pause after each poll, so a fast machine still spans several of the
    # helper's stats readings (at most 10 a second).
    ap.add_argument("--pause-ms", type=float, default=0.0)
    args = ap.parse_args()
    job = fake_torch.load(args.snapshot)
    job.advance(3)
    # The holder walk's roots here are this stand-in's own (the replayed file's
    # thousands of entries): a budget that walks them all, whatever the load.
    vramscope_live.start(args.address, token=args.token, poll_interval_s=3600.0, holders_budget_ms=2000)
    sys.stdin.readline()
    for _ in range(2):
        job.advance(args.poll)
        vramscope_live._poll_now()
    if not args.no_mark_step:
        vramscope_live.mark_step()
    while job.advance(args.poll):
        vramscope_live._poll_now()
        if args.pause_ms:
            time.sleep(args.pause_ms / 1000)
    vramscope_live.stop("the job finished")


if __name__ == "__main__":
    main()
