"""Every command shown in the README and the docs pages exists as shown: its module, its options, its paths.

The commands are the lines of the pages' unlabelled code blocks (continuation lines joined, comments dropped).
Each is checked without running it, since many run for minutes or need a release installed:

- `python -m MODULE [SUBCOMMAND] ... --opt`: the module imports, and every `--opt` appears in its own `--help`
  (the subcommand's, where the first argument names one);
- `python regenerate.py --opt`: as above;
- `pytest ... --opt` (also after `nox -s NAME --`): every option is in pytest's help with this project's plugin,
  and every path argument exists;
- `ckptspec SUBCOMMAND ... --opt`: as `python -m ckptspec.cli`;
- `nox -s NAME`: the noxfile defines the session (the release list the release, for `spec(NAME)`), and the options
  after `--` are pytest's (spec sessions) or mutation.run's (mutation);
- `pip install ... -e ".[extra,...]"`: every extra is declared in pyproject.toml.

Lines of other programs (torchrun, shell set-up, sbatch scripts) are left to docs/cluster.md's own prose. The set-up
block of the README is also run verbatim by CI (.ci/run).
"""

from __future__ import annotations

import ast
import collections
import contextlib
import functools
import importlib.util
import io
import re
import runpy
import shlex
import subprocess
import sys
import tomllib

import pytest

from ckptspec.report import releases
from ckptspec.report.runs import REPO_ROOT

PAGES = [
    "README.md",
    "CONTRIBUTING.md",
    "docs/results.md",
    "docs/benchmarks.md",
    "docs/benchmarks-ci.md",
    "docs/cluster.md",
    "docs/adding-a-target.md",
    "docs/spec-design.md",
    "docs/impl.md",
    "docs/hypothesis.md",
    "docs/gpu.md",
    "ckptspec/spec/README.md",
    "ckptspec/bench/README.md",
    "ckptspec/faults/README.md",
]
# An inline command (a `code span` of the prose) is checked as a code block's line is, unless it holds a placeholder
# (`<area>`, `a|b`, `...`, `[RUN.json ...]`): these name a shape, not a command to copy.
_INLINE = re.compile(r"(?:ckptspec |python3? -m |pytest |nox -s )")
_PLACEHOLDER = re.compile(r"[<|\[]|\.\.\.")


def _blocks(text: str) -> list[str]:
    """The contents of the unlabelled fenced code blocks of a Markdown text."""
    blocks: list[str] = []
    current: list[str] = []
    label: str | None = None
    for line in text.splitlines():
        if line.startswith("```"):
            if label is None:
                label, current = line[3:].strip(), []
            else:
                if label == "":
                    blocks.append("\n".join(current) + "\n")
                label = None
        elif label is not None:
            current.append(line)
    return blocks


def _commands(page: str) -> list[str]:
    commands = []
    for block in _blocks((REPO_ROOT / page).read_text()):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()
            if line and not line.startswith("#"):
                commands.append(line)
    return commands


def _inline_commands(page: str) -> list[str]:
    """The commands shown inline in the page's prose (outside its fenced blocks), as one would copy them."""
    prose = re.sub(r"^```.*?^```", "", (REPO_ROOT / page).read_text(), flags=re.S | re.M)
    spans = re.findall(r"`([^`]+)`", prose)
    return [s for s in (" ".join(span.split()) for span in spans) if _INLINE.match(s) and not _PLACEHOLDER.search(s)]


ALL = [(page, command) for page in PAGES for command in _commands(page) + _inline_commands(page)]


def _ids(cases: list[tuple[str, str]]) -> list[str]:
    """`page:command` (its first 60 characters); a command a page shows twice numbered 0, 1, ... as pytest would
    (its strict mode refuses duplicate ids)."""
    ids = [f"{p}:{c[:60]}" for p, c in cases]
    seen: collections.Counter[str] = collections.Counter()
    numbered = []
    for i in ids:
        numbered.append(f"{i}{seen[i]}" if ids.count(i) > 1 else i)
        seen[i] += 1
    return numbered


def _words(command: str) -> list[str]:
    words = shlex.split(command)
    while words and "=" in words[0] and not words[0].startswith("-"):  # VAR=value before the program
        words.pop(0)
    return words


def _options(words: list[str]) -> list[str]:
    return [w.split("=", 1)[0] for w in words if w.startswith("--") and len(w) > 2]


def _help(argv: list[str], module: str | None = None, path: str | None = None) -> str:
    """What `python -m module argv --help` (or `python path ...`) prints, run in this process."""
    out = io.StringIO()
    saved = sys.argv
    sys.argv = [module or path or "", *argv, "--help"]
    if module is not None:
        run = functools.partial(runpy.run_module, module, run_name="__main__", alter_sys=True)
    else:
        run = functools.partial(runpy.run_path, str(REPO_ROOT / str(path)), run_name="__main__")
    try:
        with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
            run()
    finally:
        sys.argv = saved
    return out.getvalue()


@pytest.fixture(scope="module")
def pytest_help() -> str:
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--help"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120
    )
    return done.stdout


def _check_pytest(words: list[str], help_text: str) -> None:
    missing = [o for o in _options(words) if o not in help_text]
    assert not missing, f"pytest does not know {missing}"
    for word in words:
        if not word.startswith("-") and re.match(r"^[\w./-]+(\.py)?(::\S+)?$", word) and "/" in word:
            path = word.split("::")[0]
            if not path.startswith(("conformance/", "ckptspec/bench/results/", "$")) and "$" not in path:
                assert (REPO_ROOT / path).exists(), f"no such path: {path}"


def _check_python(words: list[str], pytest_text: str) -> None:
    """`python -m MODULE ...` or `python FILE ...`; options after `--` are pytest's (loopback, regression record)."""
    rest = words[3:] if words[1] == "-m" else words[2:]
    if "--" in rest:
        _check_pytest(rest[rest.index("--") + 1 :], pytest_text)
        rest = rest[: rest.index("--")]
    if words[1] == "-m":
        assert importlib.util.find_spec(words[2]) is not None, f"no module {words[2]}"
    else:
        assert (REPO_ROOT / words[1]).exists(), f"no file {words[1]}"
    if not _options(rest):
        return
    if words[1] == "-m":
        sub = rest[:1] if rest and re.fullmatch(r"[a-z]+", rest[0]) else []
        text = _help(sub, module=words[2])
    else:
        text = _help([], path=words[1])
    missing = [o for o in _options(rest) if o not in text]
    assert not missing, f"{' '.join(words[:3])} does not take {missing}"


def _check_nox(words: list[str], help_text: str) -> None:
    noxfile = (REPO_ROOT / "noxfile.py").read_text()
    sessions = [w for i, w in enumerate(words) if i and words[i - 1] == "-s"] + [
        w for w in words[2:] if re.fullmatch(r"\w+\([\w.-]+\)", w)
    ]
    for session in sessions:
        name, _, release = session.partition("(")
        assert re.search(rf"def {re.escape(name)}\(", noxfile), f"noxfile has no session {name}"
        if release and name == "torch":  # torch(X.Y): one session per release of the supported range
            declared = re.search(r"^TORCH_RANGE = (\[.*\])$", noxfile, re.MULTILINE)
            assert declared, "noxfile has no TORCH_RANGE"
            assert release.rstrip(")") in ast.literal_eval(declared.group(1)), f"noxfile has no session {session}"
        elif release:
            assert release.rstrip(")") in releases.by_name(), f"the release list has no release {release.rstrip(')')}"
    if "--" in words:  # the spec sessions hand what follows to pytest, mutation to mutation.run
        after = words[words.index("--") + 1 :]
        if sessions[0].startswith("spec("):
            _check_pytest(after, help_text)
        elif sessions[0] == "mutation":
            source = (REPO_ROOT / "mutation" / "run.py").read_text()  # its help needs cosmic-ray (extra `mutation`)
            missing = [o for o in _options(after) if f'"{o}"' not in source]
            assert not missing, f"mutation.run does not take {missing}"


def _check_pip(words: list[str]) -> None:
    declared = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for word in words:
        extras = re.fullmatch(r"\.?\[([\w,]+)\]", word.removeprefix("."))
        for extra in extras.group(1).split(",") if extras else []:
            assert extra in declared, f"pyproject.toml declares no extra {extra!r}"


@pytest.mark.parametrize(("page", "command"), ALL, ids=_ids(ALL))
def test_a_shown_command_exists_as_shown(page, command, pytest_help):
    words = _words(command)
    program = words[0] if words else ""
    if program in ("python", "python3") and len(words) > 1 and words[1] != "-c":
        if words[1:3] == ["-m", "venv"] or words[1:3] == ["-m", "pytest"]:
            return
        _check_python(words, pytest_help)
    elif program == "pytest":
        _check_pytest(words[1:], pytest_help)
    elif program == "ckptspec":  # the console script of pyproject.toml's [project.scripts]
        _check_python(["python", "-m", "ckptspec.cli", *words[1:]], pytest_help)
    elif program == "nox":
        _check_nox(words, pytest_help)
    elif program == "pip":
        _check_pip(words)


def test_the_pages_show_commands():
    assert len(ALL) > 40, "the parser found too few commands: did a page change its code-block style?"


def test_a_wrong_command_is_caught(pytest_help):
    with pytest.raises(AssertionError, match="does not take"):
        _check_python(["python", "-m", "ckptspec.report.report", "x.json", "--udpate", "y.md"], pytest_help)
    with pytest.raises(AssertionError, match="pytest does not know"):
        _check_pytest(["ckptspec/spec", "--implementation", "nvrx"], pytest_help)
    with pytest.raises(AssertionError, match="no session"):
        _check_nox(["nox", "-s", "spec_all"], pytest_help)
    with pytest.raises(AssertionError, match="no extra"):
        _check_pip(["pip", "install", "-e", ".[test,nvrxx]"])


def test_inline_commands_are_checked_and_placeholders_are_not():
    """A command in the prose is one a user copies (issue 59: a documented option the code lacks fails CI); a shape
    with placeholders is not."""
    inline = _inline_commands("README.md")
    assert "ckptspec report --areas protocol" in inline
    assert not [c for c in inline if "|" in c or "<" in c], inline
    assert ("README.md", "ckptspec report --areas protocol") in ALL
