"""How a target's checkpoints lie on disk and are read back: the protocol layer's only view of a format.

The protocol tests never open a checkpoint themselves. They ask the target's format (`loading.checkpoint_format()`,
the adapter's optional `FORMAT`, torch DCP's by default) four things:

    fmt.data_file(location, rank)        the file rank `rank` writes (faults are placed there before the save)
    fmt.committed(location, world_size)  whether the checkpoint of `world_size` ranks counts as complete, by the
                                         library's own rule (DCP: `.metadata` exists)
    fmt.load(location, template)         the checkpoint read back in this process, without a process group, by
                                         the library's own loader; `template` (the state dict expected, zeroed)
                                         tells which keys; raises if the checkpoint cannot be read
    fmt.loader                           the loader's name, as messages say it ("dcp.load")
    fmt.marker, fmt.data_glob            the commit marker's file name (None: the format has none, each data
                                         file appears whole by a rename) and the glob of its data files, which
                                         place faults in the write and finalize phases and read a trace

`fmt.dcp` says whether stock `torch.distributed.checkpoint.load` reads the format: the clauses about DCP's own
format (P-LOAD-1) skip elsewhere, saying so; every other protocol clause judges any format the same way.
"""

from __future__ import annotations

import abc
import os
from typing import Any

__all__ = ["DCP", "CheckpointFormat", "DcpFormat"]


class CheckpointFormat(abc.ABC):
    """A checkpoint format as the protocol layer sees it (see the module docstring)."""

    name: str = ""
    loader: str = ""
    dcp: bool = False
    marker: str | None = None
    data_glob: str = "*"

    @abc.abstractmethod
    def data_file(self, location: str, rank: int) -> str:
        """The path of the (first) data file that rank `rank` writes into the checkpoint at `location`."""

    @abc.abstractmethod
    def committed(self, location: str, world_size: int) -> bool:
        """Whether the checkpoint of `world_size` ranks at `location` counts as complete by the library's rule."""

    @abc.abstractmethod
    def load(self, location: str, template: dict[str, Any]) -> dict[str, Any]:
        """The checkpoint at `location` read back without a process group: the keys of `template`, filled."""


class DcpFormat(CheckpointFormat):
    """torch DCP's file-system layout: `__<rank>_0.distcp` per rank, committed by `.metadata`, read by dcp.load."""

    name = "torch.distributed.checkpoint"
    loader = "dcp.load"
    dcp = True
    marker = ".metadata"
    data_glob = "*.distcp"

    def data_file(self, location: str, rank: int) -> str:
        return os.path.join(location, f"__{rank}_0.distcp")

    def committed(self, location: str, world_size: int) -> bool:
        return os.path.exists(os.path.join(location, ".metadata"))

    def load(self, location: str, template: dict[str, Any]) -> dict[str, Any]:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint import FileSystemReader

        dcp.load(template, storage_reader=FileSystemReader(location), no_dist=True)
        return template


DCP = DcpFormat()
