"""A real training job with a classic leak, for a recording made on a GPU
(issue 39: the holder named by variable in a real job) and for comparing a
live job against `vramscope trace` of the same script (issue 38):

    python3 -m vramscope_live --record FILE python/gpu/holders_job.py
    vramscope trace --json -- python3 python/gpu/holders_job.py

Each step trains a small MLP (SGD), then scores a validation batch without
`torch.no_grad()` and keeps the score, with its graph, in
`self.val_history`: every step keeps the validation input (512 x 1024 fp32,
2 MiB) and the ReLU's output (2 MiB) that the graph saved, and the second
Linear's output (512 x 10 fp32) that `square` saved. The fix is
`self.val_history.append(val.item())`.

The helper walks from the job's names to its tensors at most once a second
where memory grew (its defaults), so each step waits 0.6 s.
"""

import time

import torch

STEPS = 10


class Trainer:
    def __init__(self):
        self.model = torch.nn.Sequential(
            torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10)
        ).cuda()
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01)
        self.val_history = []

    def train(self):
        for _ in range(STEPS):
            x = torch.randn(512, 1024, device="cuda")
            loss = self.model(x).square().mean()
            loss.backward()
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
            v = torch.randn(512, 1024, device="cuda")
            val = self.model(v).square().mean()
            self.val_history.append(val)  # the leak: the score with its graph
            time.sleep(0.6)


if __name__ == "__main__":
    Trainer().train()
    print(
        "peak allocated %d B, allocated at the end %d B"
        % (torch.cuda.max_memory_allocated(), torch.cuda.memory_allocated())
    )
