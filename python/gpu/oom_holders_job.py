"""A real job that runs out of memory inside one evaluation (issue 39: at an
OOM, the holders named by variable), for a recording made on a GPU:

    python3 -m vramscope_live --record FILE python/gpu/oom_holders_job.py

It holds the process to 1 GiB of the GPU (set_per_process_memory_fraction),
builds a 1024-4096-1024 MLP, then evaluates batch after batch without
`torch.no_grad()`, keeping every output in `outputs`: each output keeps its
graph (the batch, 1 MiB, and the ReLU's 4 MiB result) until PyTorch raises
OutOfMemoryError, which ends the program. The helper's excepthook sends
PyTorch's message and walks from the failing frame to name `outputs`.
The fix: `with torch.no_grad():` around the loop, or `outputs.append(out.cpu())`.
"""

import torch


def evaluate(model):
    outputs = []
    for _ in range(100_000):
        batch = torch.randn(256, 1024, device="cuda")
        outputs.append(model(batch))  # the leak: each output with its graph
    return outputs


def main():
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction((1 << 30) / total)
    model = torch.nn.Sequential(
        torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024)
    ).cuda()
    evaluate(model)


if __name__ == "__main__":
    main()
