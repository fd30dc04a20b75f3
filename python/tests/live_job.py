"""A stand-in training job for end-to-end tests of `vramscope attach`: the
helper (poll mode) serves a job the stand-in torch plays from a real
snapshot, the way a user's job would run it.

    python3 python/tests/live_job.py SNAPSHOT ADDRESS [--token T]

It plays 3 entries, calls start(ADDRESS), then waits for a line on stdin
(the test sends one once `vramscope attached` is on stderr), plays the rest
of the trace in polls of 5 entries with a mark_step() after the first two
polls, and stops with "the job finished".
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "fake_torch"))
sys.path.insert(0, os.path.dirname(HERE))

import fake_torch  # noqa: E402
import vramscope_live  # noqa: E402


def main():
    snapshot, address = sys.argv[1], sys.argv[2]
    token = sys.argv[4] if len(sys.argv) > 4 and sys.argv[3] == "--token" else None
    job = fake_torch.load(snapshot)
    job.advance(3)
    vramscope_live.start(address, token=token, poll_interval_s=3600.0)
    sys.stdin.readline()
    for _ in range(2):
        job.advance(5)
        vramscope_live._poll_now()
    vramscope_live.mark_step()
    while job.advance(5):
        vramscope_live._poll_now()
    vramscope_live.stop("the job finished")


if __name__ == "__main__":
    main()
