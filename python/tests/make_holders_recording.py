"""Regenerate tests/fixtures/live/history-leak.vslive.

A traced job, not a real one: the helper (poll mode) records a job that the
stand-in torch plays from the project's H100 capture
tests/fixtures/pytorch/captured/peak_inside_step.pickle (its first 100
entries before the loop, the rest after it), while the "user's" loop below trains a stand-in Linear layer and keeps every step's loss, with
its graph, in `self.history`. Each Optimizer.step is a step boundary where
the helper walks from the loop's frames to the tensors and sends a
`holders` message naming `self.history`. The helper's defaults (a walk
when memory grew by 1 MiB, at most once a second) are kept but for the
interval, which the loop's pace would not reach. Host name and argv are
fixed; times are real.

    python3 python/tests/make_holders_recording.py [OUT]
"""

import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(HERE, "fake_torch"))
sys.path.insert(0, os.path.dirname(HERE))

import fake_torch  # noqa: E402
import torch  # noqa: E402  (the stand-in)
import vramscope_live  # noqa: E402

DEFAULT_OUT = os.path.join(REPO, "tests", "fixtures", "live", "history-leak.vslive")
SNAPSHOT = os.path.join(REPO, "tests", "fixtures", "pytorch", "captured", "peak_inside_step.pickle")
STEPS = 6


class Trainer:
    def __init__(self):
        self.model = torch.nn.Linear(256, 256)
        self.opt = torch.optim.SGD(self.model.parameters())
        self.history = []

    def train(self):
        for _ in range(STEPS):
            x = torch.randn(512, 256)
            out = self.model(x)
            loss = torch.sum(out)
            self.history.append(loss)  # the leak: the loss with its graph
            self.opt.step()


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else DEFAULT_OUT
    job = fake_torch.load(SNAPSHOT)
    vramscope_live.socket.gethostname = lambda: "fixture-host"
    vramscope_live.HOLDERS_MIN_INTERVAL_S = 0.0
    sys.argv = ["train.py"]
    with tempfile.TemporaryDirectory() as tmp:
        vramscope_live.start(os.path.join(tmp, "job.sock"), record_to=out, poll_interval_s=3600.0)
        job.advance(100)  # the captured job's first allocations
        vramscope_live._poll_now()
        Trainer().train()
        while job.advance(50):
            vramscope_live._poll_now()
        vramscope_live.stop("the job finished")
    print(f"wrote {out} ({os.path.getsize(out)} bytes)")


if __name__ == "__main__":
    main()
