import sys

import fake_torch


def _record_memory_history(enabled="all", context="all", stacks="all", max_entries=sys.maxsize, device=None):
    job = fake_torch.job()
    job.recording = enabled is not None
    job.max_entries = max_entries
    job.record_stacks = context is not None
    if not job.recording:
        for ring in job.rings:
            ring.clear()
        job.annotations.clear()


def _snapshot(device=None, include_traces=True):
    job = fake_torch.job()
    if not include_traces and not job.include_traces_supported:
        raise TypeError("_snapshot() got an unexpected keyword argument 'include_traces'")
    return job.snapshot(include_traces)
