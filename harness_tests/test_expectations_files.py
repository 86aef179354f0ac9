"""Every entry of every built-in target's expectations file says how the target fails (issue 45).

An entry without `match` accepts any failure of its test, a harness precondition included (a fault that never
fired, a bound the machine was too slow for), and so would show a failure that was never measured. The `match`
must be a regular expression that compiles.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

FILES = sorted((Path(__file__).parents[1] / "ckptspec/spec" / "targets").glob("*.expectations.toml"))


def test_there_are_files_to_check():
    assert FILES, "no ckptspec/spec/targets/*.expectations.toml found"


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_every_entry_has_a_match(path):
    entries = tomllib.loads(path.read_text()).get("xfail", [])
    missing = [f"{e['test']} [{e['clause']}, {e.get('versions', 'all releases')}]" for e in entries if "match" not in e]
    assert not missing, f"{path.name}: entries without match:\n" + "\n".join(missing)
    for entry in entries:
        re.compile(entry["match"])
