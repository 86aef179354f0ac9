"""Generated blocks of Markdown files: the lines between `<!-- NAME:start -->` and `<!-- NAME:end -->`.

Every generated table or count in the README and docs lives in such a block, so a command can replace it without
touching the prose around it (and CI can regenerate it and find no difference).
"""

from __future__ import annotations

import sys
from pathlib import Path

from ckptspec.report.runs import ReportError

__all__ = ["END_MARKER", "START_MARKER", "markers", "replace_block", "update_file", "write_block"]

START_MARKER = "<!-- conformance:start -->"
END_MARKER = "<!-- conformance:end -->"


def markers(name: str) -> tuple[str, str]:
    """The start and end marker lines of the block called `name`."""
    return f"<!-- {name}:start -->", f"<!-- {name}:end -->"


def replace_block(text: str, block: str, name: str = "input", start: str = START_MARKER, end: str = END_MARKER) -> str:
    """`text` with the lines between the `start` and `end` marker lines replaced by `block` (ReportError if the
    markers are missing or out of order)."""
    lines = text.splitlines(keepends=True)
    stripped = [line.strip() for line in lines]
    starts = [i for i, s in enumerate(stripped) if s == start]
    ends = [i for i, s in enumerate(stripped) if s == end]
    if len(starts) != 1 or len(ends) != 1 or ends[0] < starts[0]:
        raise ReportError(
            f"{name}: needs exactly one line {start} followed later by one "
            f"line {end} (found {len(starts)} start, {len(ends)} end)"
        )
    if not block.endswith("\n"):
        block += "\n"
    return "".join(lines[: starts[0] + 1]) + block + "".join(lines[ends[0] :])


def update_file(path: Path, block: str, start: str = START_MARKER, end: str = END_MARKER) -> None:
    """Replace the block between the marker lines of the file at `path` (see replace_block)."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ReportError(f"{path}: cannot read: {exc.strerror or exc}") from None
    path.write_text(replace_block(text, block, str(path), start, end))


def write_block(block: str, update: Path | None, start: str = START_MARKER, end: str = END_MARKER) -> None:
    """Print `block`, or with `update`, put it between the marker lines of that file (see replace_block)."""
    if update is None:
        sys.stdout.write(block)
    else:
        update_file(update, block, start, end)
