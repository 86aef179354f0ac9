"""Print the commands of the README's "Set up and run" block, one per line (what a new user copies).

Exit status 1, with the reason, if the block is missing or does not hold exactly two commands: the README
promises two, and CI runs these lines verbatim.
"""

import sys
from pathlib import Path

HEADING = "## Set up and run"


def commands(readme: Path) -> list[str]:
    lines = readme.read_text().splitlines()
    start = lines.index(HEADING)
    fences = [i for i in range(start, len(lines)) if lines[i].startswith("```")][:2]
    if len(fences) < 2:
        raise ValueError(f"{readme}: no code block under {HEADING!r}")
    return [line.strip() for line in lines[fences[0] + 1 : fences[1]] if line.strip()]


if __name__ == "__main__":
    readme = Path(__file__).resolve().parent.parent / "README.md"
    try:
        found = commands(readme)
    except ValueError as error:  # includes a missing heading (list.index)
        sys.exit(f"readme_commands: {error}")
    if len(found) != 2:
        sys.exit(f"readme_commands: {HEADING!r} holds {len(found)} commands, not 2: {found}")
    print("\n".join(found))
