"""The interface between a user's state dict and the local checkpoint managers.

A ``TensorAwareStateDict`` (TASD) wraps a state dict and can take its tensors out and put them back,
so the manager can move tensor data (between devices, between ranks) separately from everything else.

Laws every implementation keeps (the managers rely on them):

* ``x.insert_tensors(x.pop_tensors())`` leaves ``x`` as it was.
* ``pop_tensors()`` makes ``x`` hollow: placeholders keep each tensor's shape, dtype and device;
  ``tensors`` and ``pop_tensors`` need a non-hollow ``x``; ``insert_tensors`` and ``init_tensors`` a
  hollow one.
* Tensors come out, and go back in, in one fixed order.
* A hollow TASD is picklable and small: it is what crosses between ranks and processes.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, ValuesView
from typing import Any

import torch

__all__ = ["TensorAwareStateDict"]


class TensorAwareStateDict(ABC):
    """A state dict whose tensors can be taken out and put back (see the module docstring)."""

    @abstractmethod
    def pop_tensors(self) -> list[torch.Tensor]:
        """Take every tensor out, leaving placeholders; return the tensors in traversal order."""

    @property
    @abstractmethod
    def tensors(self) -> Iterable[torch.Tensor]:
        """The tensors, in traversal order (only while not hollow)."""

    @property
    @abstractmethod
    def is_hollow(self) -> bool:
        """True between ``pop_tensors`` (or construction from placeholders) and ``insert_tensors``."""

    @abstractmethod
    def insert_tensors(self, tensor_data: Iterable[torch.Tensor]) -> None:
        """Replace the placeholders, in traversal order, with ``tensor_data``."""

    @abstractmethod
    def init_tensors(self) -> None:
        """Replace the placeholders with new uninitialised tensors of the same shape, dtype and device."""

    @abstractmethod
    def copy_tensors_to_cpu(self, non_blocking: bool = False) -> None:
        """Replace the tensors by CPU copies (the originals are left intact, just no longer held)."""

    @abstractmethod
    def restore_tensor_device(self, non_blocking: bool = True) -> None:
        """Move the tensors back to the device they are meant to live on."""

    def values(self) -> ValuesView[Any]:
        """The instance attributes' values."""
        return vars(self).values()
