import collections

import fake_torch

from . import memory  # noqa: F401

_Props = collections.namedtuple("_Props", "name total_memory pci_domain_id pci_bus_id pci_device_id uuid")


class _Uuid:
    """torch's `_CUuuid`: written bare, without NVML's `GPU-`."""

    def __init__(self, text):
        self.text = text

    def __str__(self):
        return self.text


def is_available():
    return True


def device_count():
    return fake_torch.job().n_devices


def get_device_properties(device):
    job = fake_torch.job()
    return _Props(f"Fake GPU {device}", job.total_memory, 0, job.pci_bus + device, 0,
                  _Uuid("8e3c0f7a-0000-4000-8000-%012x" % device))


def memory_stats(device=None):
    return fake_torch.job().memory_stats(device or 0)


def memory_allocated(device=None):
    """The replayed job's allocated bytes, plus the tensors a test made."""
    from .._tensor import ALLOCATED

    stats = fake_torch.job().memory_stats(device or 0)
    return stats.get("allocated_bytes.all.current", 0) + (ALLOCATED[0] if not device else 0)
