"""Damage after commit, chosen by hypothesis and applied to files the tests find by listing (target-neutral).

A `Damage` names a kind (truncate, flip a bit, swap in another checkpoint's file, delete), which file of a
sorted listing, and where in it. `apply` reports the path it changed, or None when the choice changes nothing
(an empty file to truncate, a swap with identical bytes), which the tests discard.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from hypothesis import strategies as st

__all__ = ["KINDS", "Damage", "apply", "damages", "files_under"]

KINDS = ("truncate", "flip", "swap", "delete")


@dataclass(frozen=True)
class Damage:
    kind: str
    file: int  # index into the listing, modulo its length
    where: float  # in [0, 1): the truncation point or the byte to flip, as a fraction of the file's size
    bit: int  # 0..7, the bit to flip
    source: int = 0  # swap: index into the other checkpoint's files, when none has the same name

    def describe(self, path: str) -> str:
        return f"{self.kind} of {os.path.basename(path)} (at {self.where:.3f}, bit {self.bit})"


def damages(kinds=KINDS):
    return st.builds(
        Damage,
        kind=st.sampled_from(kinds),
        file=st.integers(0, 63),
        where=st.floats(0, 1, exclude_max=True, allow_nan=False),
        bit=st.integers(0, 7),
        source=st.integers(0, 63),
    )


def files_under(root: str) -> list[str]:
    """Every file under root, sorted (hidden ones included)."""
    return sorted(os.path.join(d, f) for d, _, names in os.walk(root) for f in names)


def apply(damage: Damage, files: list[str], others: list[str]) -> str | None:
    """Damage one of `files` (a swap copies in one of `others`); the path changed, or None if nothing changed."""
    if not files:
        return None
    path = files[damage.file % len(files)]
    with open(path, "rb") as f:
        data = f.read()
    if damage.kind == "delete":
        os.remove(path)
        return path
    if damage.kind == "swap":
        same_name = [o for o in others if os.path.basename(o) == os.path.basename(path)]
        pool = same_name or others
        if not pool:
            return None
        with open(pool[damage.source % len(pool)], "rb") as f:
            new = f.read()
    elif not data:
        return None
    elif damage.kind == "truncate":
        new = data[: int(damage.where * len(data))]
    else:
        pos = int(damage.where * len(data))
        new = data[:pos] + bytes([data[pos] ^ (1 << damage.bit)]) + data[pos + 1 :]
    if new == data:
        return None
    with open(path, "wb") as f:
        f.write(new)
    return path
