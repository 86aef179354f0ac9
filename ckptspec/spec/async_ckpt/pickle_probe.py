"""A state-dict value that records which process pickles it: where a checkpoint is actually serialized."""

from __future__ import annotations

import os


class PidOnPickle:
    """Appends the pid of every process that pickles it to `path`; unpickles to an equal probe."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        with open(self.path, "a") as f:
            f.write(f"{os.getpid()}\n")
        return (PidOnPickle, (self.path,))


def pickled_by(path: str) -> list[int]:
    """The pids recorded in `path`, in order."""
    with open(path) as f:
        return [int(line) for line in f.read().split()]
