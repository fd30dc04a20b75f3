import collections

import fake_torch

from . import memory  # noqa: F401

_Props = collections.namedtuple("_Props", "name total_memory")


def is_available():
    return True


def device_count():
    return fake_torch.job().n_devices


def get_device_properties(device):
    return _Props(f"Fake GPU {device}", fake_torch.job().total_memory)


def memory_stats(device=None):
    return fake_torch.job().memory_stats(device or 0)
