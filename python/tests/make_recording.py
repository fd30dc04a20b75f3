"""Regenerate tests/fixtures/live/peak-inside-step.vslive.

The helper (poll mode) records a job played by the stand-in torch from the
project's H100 capture tests/fixtures/pytorch/captured/peak_inside_step.pickle
(three AdamW steps of a small MLP): 3 entries happen
before start(), the rest in polls of a few entries, an explicit mark_step()
after entry 17 of the file, (0.2 s later) the file's own Optimizer.steps (a step hook at
the END of each annotation), then stop(). Host name and argv are fixed so that the
file says nothing about the machine that made it; times are real.

    python3 python/tests/make_recording.py [OUT] [SNAPSHOT]
"""

import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(HERE, "fake_torch"))
sys.path.insert(0, os.path.dirname(HERE))

import fake_torch  # noqa: E402
import vramscope_live  # noqa: E402

DEFAULT_OUT = os.path.join(REPO, "tests", "fixtures", "live", "peak-inside-step.vslive")
DEFAULT_SNAPSHOT = os.path.join(REPO, "tests", "fixtures", "pytorch", "captured", "peak_inside_step.pickle")


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else DEFAULT_OUT
    snapshot = sys.argv[2] if len(sys.argv) > 2 else DEFAULT_SNAPSHOT
    job = fake_torch.load(snapshot)
    vramscope_live.socket.gethostname = lambda: "fixture-host"
    sys.argv = ["train.py", "--steps", "1"]
    job.advance(3)
    with tempfile.TemporaryDirectory() as tmp:
        vramscope_live.start(os.path.join(tmp, "job.sock"), record_to=out, poll_interval_s=3600.0)
        for n in (6, 8):
            job.advance(n)
            vramscope_live._poll_now()
        vramscope_live.mark_step()
        time.sleep(0.2)  # stats come at most 10 times a second: let Optimizer.step have its own
        while job.advance(5):
            vramscope_live._poll_now()
        vramscope_live.stop("the job finished")
    print(f"wrote {out} ({os.path.getsize(out)} bytes)")


if __name__ == "__main__":
    main()
