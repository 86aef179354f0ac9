"""The suite collects the same tests, without an error, in every form a user starts it (issue 22).

Each form runs in a subprocess (two at a time, each with a timeout). Forms with xdist workers run them for real
(collect_probe: every worker writes what it collected and runs nothing; --collect-only would turn xdist off; -n
auto is bounded to one worker, -n 2 checks that both collect the same); the others use --collect-only. Where two forms ask for the same scope they must collect
the same node ids: the whole suite (testpaths), one area, or the tests of one -k expression.
"""

from __future__ import annotations

import importlib.util
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from harness_tests.pytest_runs import REPO_ROOT, clean_env, run_pytest

AREAS = ("ckptspec/spec", "ckptspec/faults", "ckptspec/bench")
K = "finalize or summary"  # selects tests of all three areas
PARALLEL = 2


@dataclass(frozen=True)
class Form:
    name: str
    args: tuple[str, ...]
    scope: tuple[str, ...] | str  # "all", "k" (the tests of -k K), or areas
    cwd: str = "."  # relative to the repository; "<elsewhere>" is a temporary directory
    script: bool = False  # the `pytest` script instead of `python -m pytest`
    workers: int = 0  # xdist workers that really collect (-n N, or -n auto bounded to N)

    def run(self, elsewhere: Path):
        cwd = elsewhere if self.cwd == "<elsewhere>" else REPO_ROOT / self.cwd
        args = list(self.args) if self.workers else [*self.args, "--collect-only", "-q"]
        env = clean_env(PYTEST_XDIST_AUTO_NUM_WORKERS=str(self.workers or 1))
        # A form is how the interpreter starts: a new one each time, never a fork of a warm one.
        return run_pytest(args, cwd, script=self.script, fresh=not self.script, probe=True, env=env)


_ROOT = str(REPO_ROOT)
# Each full collection costs seconds of CPU (a new interpreter importing torch): the forms cover each way of starting
# the suite once, and options that cannot interfere share a form (-n 0 with -p no:randomly). An area alone is
# collected by `pytest ckptspec/spec`, by the form run in ckptspec/bench/ and by the one elsewhere (ckptspec/faults with
# ckptspec/bench, no ckptspec/spec).
_NO_RANDOMLY = ("-p", "no:randomly") if importlib.util.find_spec("pytest_randomly") is not None else ()
FORMS = [
    Form("python -m pytest", (), "all"),
    Form(
        f"pytest -n 0 --impl impl {' '.join(_NO_RANDOMLY)}",
        ("-n", "0", "--impl", "impl", *_NO_RANDOMLY),
        "all",
        script=True,
    ),
    Form("pytest -p no:xdist", ("-p", "no:xdist"), "all", script=True),
    Form("pytest -n auto (1 worker)", ("-n", "auto"), "all", script=True, workers=1),
    Form("python -m pytest -n 2 --impl impl -k K", ("-n", "2", "--impl", "impl", "-k", K), "k", workers=2),
    Form("pytest -k K", ("-k", K), "k", script=True),
    Form("pytest ckptspec/spec", ("ckptspec/spec",), ("ckptspec/spec",), script=True),
    Form(
        "pytest --impl impl (in ckptspec/bench/)",
        ("--impl", "impl"),
        ("ckptspec/bench",),
        cwd="ckptspec/bench",
        script=True,
    ),
    Form(
        "pytest --rootdir ROOT -c ROOT/pyproject.toml ROOT/ckptspec/faults ROOT/ckptspec/bench (elsewhere)",
        ("--rootdir", _ROOT, "-c", f"{_ROOT}/pyproject.toml", f"{_ROOT}/ckptspec/faults", f"{_ROOT}/ckptspec/bench"),
        ("ckptspec/faults", "ckptspec/bench"),
        cwd="<elsewhere>",
        script=True,
    ),
]


def _problems(form: Form, run) -> tuple[list[str], list[str]]:
    """What is wrong with the run (beyond its node ids), and its node ids."""
    problems = []
    if run.code not in (0, 5) or "INTERNALERROR" in run.output or "Traceback" in run.output or "ERROR" in run.output:
        problems.append("exit status or output shows an error")
    expected_processes = {f"gw{i}" for i in range(form.workers)} or {"main"}
    if set(run.collected) != expected_processes:
        problems.append(f"collecting processes {sorted(run.collected)}, expected {sorted(expected_processes)}")
    lists = list(run.collected.values())
    if any(ids != lists[0] for ids in lists):
        problems.append("xdist workers collected different tests")
    return problems, (lists[0] if lists else [])


def test_every_form_collects_the_same_tests_without_errors(tmp_path):
    with ThreadPoolExecutor(PARALLEL) as pool:
        runs = list(pool.map(lambda form: form.run(tmp_path), FORMS))
    report, ids_of = [], {}
    for form, run in zip(FORMS, runs, strict=True):
        problems, ids = _problems(form, run)
        ids_of[form.name] = ids
        if problems:
            report.append(f"{form.name}: {'; '.join(problems)}\n{run.describe()}")
    everything = ids_of[FORMS[0].name]
    by_area = {area: [i for i in everything if i.startswith(area + "/")] for area in AREAS}
    for form in FORMS:
        got = ids_of[form.name]
        if form.scope == "all":
            want = everything
        elif form.scope == "k":
            want = ids_of["pytest -k K"]
        else:
            want = [i for area in form.scope for i in by_area[area]]
        if sorted(got) != sorted(want):
            missing, extra = sorted(set(want) - set(got)), sorted(set(got) - set(want))
            report.append(
                f"{form.name}: {len(got)} tests, expected {len(want)} (scope {form.scope}); "
                f"missing {missing[:5]}, extra {extra[:5]}"
            )
    print("\n".join(f"{form.name}: {len(ids_of[form.name])} tests" for form in FORMS))
    assert not report, "\n\n".join(report)
    assert all(by_area.values()), everything[:10]
    assert sum(map(len, by_area.values())) == len(everything), everything[:10]
    k = ids_of["pytest -k K"]
    assert 0 < len(k) < len(everything)
    assert set(k) <= set(everything)
