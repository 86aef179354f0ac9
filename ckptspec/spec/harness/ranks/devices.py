"""Where the trainer's tensors live in the snapshot family: `--tensor-device cpu|cuda` (or $CKPTSPEC_TENSOR_DEVICE).

The snapshot clauses (AQ-14, FS-4, TAC-1, TAC-2, P-SNAP-1, P-STAGED-1, P-ISO-1) say what a save holds when the
trainer changes its tensors after the call returned; NVRx and Megatron-Core document staging for GPU tensors, so
the same tests run with the trainer's state on the GPU too. Contract:

- `add_option(group)` declares `--tensor-device`; `configure(option)` resolves the device (the option, else the
  environment, else "cpu"), refuses anything but "cpu" and "cuda" with one line (pytest.UsageError), and writes it
  back to the environment, so that pytest-xdist workers, rank processes and their children build their state on
  the same device.
- `current()` is that device, in any process of the run.
- A test marked `@pytest.mark.tensor_device` builds the trainer's state on `current()` (`strategies.private_copy(...,
  device=current())`); what it expects stays on the CPU (comparisons are by value). Unmarked tests ignore the option.
- `skip_reason(item)`: with "cuda" asked and no CUDA device, a marked test skips with `NO_GPU`.
"""

from __future__ import annotations

import os

import pytest

ENV_VAR = "CKPTSPEC_TENSOR_DEVICE"
DEVICES = ("cpu", "cuda")
MARKER = "tensor_device: the trainer's state lives on --tensor-device (cpu or cuda; the snapshot family)"
NO_GPU = "CUDA tensors requested (--tensor-device cuda) but no GPU"


def add_option(group: pytest.OptionGroup) -> None:
    """`--tensor-device` in the plugin's option group."""
    group.addoption(
        "--tensor-device",
        default=None,
        choices=DEVICES,
        help=f"device of the trainer's state in the snapshot family (default: ${ENV_VAR} or cpu)",
    )


def configure(option: str | None) -> str:
    """The run's tensor device, validated and written to the environment."""
    device = option or os.environ.get(ENV_VAR) or "cpu"
    if device not in DEVICES:
        source = "--tensor-device" if option else f"${ENV_VAR}"
        raise pytest.UsageError(f"{source} {device!r} is not one of {', '.join(DEVICES)}")
    os.environ[ENV_VAR] = device
    return device


def current() -> str:
    """The device of the trainer's tensors in marked tests ("cpu" unless the run asked for "cuda")."""
    return os.environ.get(ENV_VAR) or "cpu"


def skip_reason(item: pytest.Item) -> str | None:
    """Why a marked test cannot run here (CUDA asked, none present), else None."""
    if current() != "cuda" or item.get_closest_marker("tensor_device") is None:
        return None
    import torch

    return None if torch.cuda.is_available() else NO_GPU
