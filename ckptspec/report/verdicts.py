"""Verdict words: what a recorded run says about one clause, in words a user reads without a legend.

Each test that cites a clause judges it, or not:

    passed (or xpass: a non-strict entry that passed)     -> passes
    xfail whose expectations entry names the clause       -> by the entry's `verdict`, else by the clause's basis:
        basis documented                                   -> breaks its documentation
        basis implied                                      -> misses an implied rule
        basis decision                                     -> stricter than documented
        verdict api-changed                                -> API changed in this release
        verdict documented-otherwise                       -> not applicable (documented otherwise)
        verdict decision                                   -> stricter than documented (for this target)
        verdict implied                                    -> misses an implied rule (for this target)
        verdict blocked                                    -> not judged (its tests fail on another clause)
    xfail whose entry names other clauses                  -> nothing: that test broke another clause
    failed / error: the target could not be set up         -> not judged (could not set up)
        (an ImportError: the library, or what the adapter imports of it, cannot be imported here)
    failed / error (no entry expected it)                  -> FAILS (not in expectations)
    skipped: no GPU                                        -> not run here (GPU)
    skipped: the target lacks a capability                 -> not applicable (lacks CAPABILITY)
    skipped: the target maps no module the test needs      -> not applicable (no such module)
    skipped otherwise                                      -> skipped

The clause's verdict is the first of these present, in the order FAILS, breaks / misses / stricter, could not set
up, API changed, documented otherwise, passes, the skip words; "(k of n tests)" follows when only k of the n judging tests say it.
A clause all of whose tests broke other clauses is "not judged (its tests fail on another clause)"; one no test
cites, "not covered". A strict clause with a weak level that breaks while its weak level passes is "weak level
only". A clause whose tests passed this time but whose intermittent entry (a race seen on some runs) charges it
says so: "fails 2 of 3 runs" (the entry's count); an intermittent entry that failed this time adds its count to the
broken word: "breaks its documentation (intermittent: failed 2 of 3 runs)". A snapshot clause (field `snapshot`) judged with CPU tensors says so: "passes (CPU tensors)".
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from ckptspec.report.runs import Record

__all__ = [
    "BROKEN_WORDS",
    "LEGEND",
    "NOT_COVERED",
    "NOT_JUDGED",
    "NOT_SET_UP",
    "PASSES",
    "SOME_RUNS",
    "Verdict",
    "basis_of",
    "judge",
    "judge_tests",
    "level",
]

PASSES = "passes"
UNEXPECTED = "FAILS (not in expectations)"
BROKEN_WORDS = {
    "documented": "breaks its documentation",
    "implied": "misses an implied rule",
    "decision": "stricter than documented",
}
API_CHANGED = "API changed in this release"
DOCUMENTED_OTHERWISE = "not applicable (documented otherwise)"
WEAK_ONLY = "weak level only"
NOT_RUN_GPU = "not run here (GPU)"
SKIPPED = "skipped"
NOT_JUDGED = "not judged (its tests fail on another clause)"
NOT_COVERED = "not covered"
NOT_SET_UP = "not judged (could not set up)"
SOME_RUNS = (
    "fails "  # the prefix of "fails k of n runs": an intermittent entry's pass (the symptom seen on k of n runs)
)
_ENTRY_VERDICTS = {
    "api-changed": API_CHANGED,
    "documented-otherwise": DOCUMENTED_OTHERWISE,
    "decision": BROKEN_WORDS["decision"],
    "implied": BROKEN_WORDS["implied"],
    "blocked": NOT_JUDGED,  # every save fails on another clause's mechanism first (the entry's reason names it)
}
# Precedence of the words a clause's tests may say (a capability's skip word is matched by its prefix).
NO_MODULE = "not applicable (no such module)"
_ORDER = (
    UNEXPECTED,
    *BROKEN_WORDS.values(),
    WEAK_ONLY,
    SOME_RUNS,
    NOT_SET_UP,
    API_CHANGED,
    DOCUMENTED_OTHERWISE,
    PASSES,
    "not applicable (lacks",
)
_ORDER += (NO_MODULE,)
_ORDER += (NOT_RUN_GPU, SKIPPED, NOT_JUDGED, NOT_COVERED)
_LACKS = re.compile(r"lacks (?P<capability>[a-z_]+)")

LEGEND = (
    "Words: **passes**; **breaks its documentation** (a documented promise; the clause quotes the source); "
    "**misses an implied rule** (implied by the library's own code or docstrings); **stricter than documented** "
    "(a decision of this spec, not a promise of the library); **weak level only** (misses the strict clause, keeps "
    "its weak level); **API changed in this release** / **not applicable (documented otherwise)** (the release "
    "renamed the API, or documents something else); **not run here (GPU)**; **not applicable (lacks X)** (the "
    "target has no such feature) / **not applicable (no such module)** (the adapter maps none of the NVRx modules "
    "the test uses); **not judged** (the clause's tests failed on another clause, or could not set up the library: "
    "an import error of the environment or the adapter, not a verdict); **(k of n tests)**: "
    "only k of the n tests judging the clause say so; **fails k of n runs**: the tests passed this time, and fail on k "
    "of n recorded runs (an intermittent expectations entry: a race, or a hang seen on some runs). A failure counts only against the clauses its expectations "
    "entry names."
)


class Verdict(NamedTuple):
    word: str
    k: int = 0  # tests that say `word`
    n: int = 0  # tests that judge the clause
    note: str = ""  # e.g. "intermittent: failed 2 of 3 runs", "CPU tensors"

    def __str__(self) -> str:
        extras = [f"{self.k} of {self.n} tests"] if self.k < self.n else []
        extras += [self.note] if self.note else []
        return f"{self.word} ({'; '.join(extras)})" if extras else self.word

    @property
    def broken(self) -> bool:
        return self.word in BROKEN_WORDS.values()

    @property
    def intermittent(self) -> bool:
        """Fails on some runs: "fails k of n runs" (an intermittent entry's pass is a race not seen this time)."""
        return self.word.startswith(SOME_RUNS)

    @property
    def missed(self) -> bool:
        """The clause is not kept: broken, kept at its weak level only, or failing on some runs."""
        return self.broken or self.word == WEAK_ONLY or self.intermittent or "intermittent" in self.note


def basis_of(clause: Mapping[str, Any]) -> str:
    """A clause's basis (documented, implied, decision); a clause recorded before bases were has a decision text or
    is taken as documented."""
    return str(clause.get("basis") or ("decision" if clause.get("decision") else "documented"))


def _skip_word(message: str) -> str:
    if "CUDA" in message or "GPU" in message:
        return NOT_RUN_GPU
    lacks = _LACKS.search(message)
    if lacks:
        return f"not applicable (lacks {lacks['capability']})"
    # ckptspec.spec.harness.applicability: an area the target maps no module of, or a module it does not map
    return NO_MODULE if "not applicable: " in message or "has no module for" in message else SKIPPED


def _word(record: Record, charged_word: str) -> str | None:
    """What one test says about a clause it cites, given the word of the clause when broken; None: nothing."""
    if record.outcome in ("failed", "error"):
        return NOT_SET_UP if record.setup_failure else UNEXPECTED
    if record.outcome == "xfail":
        return _ENTRY_VERDICTS.get(record.verdict or "", charged_word)
    if record.outcome in ("passed", "xpass"):
        return PASSES
    return _skip_word(record.message)


def _rank(word: str) -> int:
    return next(i for i, prefix in enumerate(_ORDER) if word.startswith(prefix))


def _aggregate(words: Sequence[str], notes: Iterable[str]) -> Verdict:
    if not words:
        return Verdict(NOT_JUDGED)
    word = min(words, key=_rank)
    return Verdict(word, words.count(word), len(words), "; ".join(dict.fromkeys(n for n in notes if n)))


def _some_runs(verdict: Verdict, passing: Sequence[Record]) -> Verdict:
    """A pass whose tests include intermittent entries' passes (`passing`) as "fails k of n runs": the entries'
    counts, k the tests with such an entry."""
    counts = [str(r.intermittent) for r in passing if r.intermittent]
    if verdict.word != PASSES or not counts:
        return verdict
    word = SOME_RUNS + "; ".join(dict.fromkeys(c.removeprefix("failed ") for c in counts))
    note = "; ".join(n for n in verdict.note.split("; ") if n and not n.startswith("intermittent: "))
    return Verdict(word, len(counts), verdict.n, note)


def judge(
    records: Sequence[Record], clause_id: str, registry: Mapping[str, Mapping[str, Any]], cpu_tensors: bool = False
) -> Verdict:
    """The verdict on `clause_id` of the tests (`records`) that cite it; `cpu_tensors`: the run built its snapshot
    tensors on the CPU."""
    if not records:
        return Verdict(NOT_COVERED)
    clause = registry.get(clause_id, {})
    broken = BROKEN_WORDS[basis_of(clause)]
    judging = [r for r in records if r.outcome != "xfail" or clause_id in r.charged]
    words = [w for w in (_word(r, broken) for r in judging) if w is not None]
    notes = [f"intermittent: {r.intermittent}" for r in judging if r.intermittent and clause_id in r.charged]
    passing = [r for r in judging if r.outcome in ("passed", "xpass") and r.intermittent and clause_id in r.charged]
    verdict = _some_runs(_aggregate(words, notes), passing)
    if cpu_tensors and clause.get("snapshot") and not verdict.word.startswith(("not ", "skipped")):
        verdict = verdict._replace(note="; ".join(filter(None, [verdict.note, "CPU tensors"])))
    return verdict


def judge_tests(
    records: Sequence[Record],
    registry: Mapping[str, Mapping[str, Any]],
    clause_word: Callable[[str], str] | None = None,
) -> Verdict:
    """The verdict of a group of tests (a cell of the fault matrix): each test judged on the clauses its
    expectations entry charges: by `clause_word(clause)`, the clause's verdict word in the run (so that a cell says
    "weak level only" where the clause's row and findings page do), or else by its first charged clause's basis."""
    words, notes = [], []
    for record in records:
        charged = sorted(record.charged)
        broken = BROKEN_WORDS[basis_of(registry.get(charged[0], {}))] if charged else BROKEN_WORDS["documented"]
        if charged and clause_word is not None:
            broken = min((clause_word(cid) for cid in charged), key=_rank)
        word = _word(record, broken)
        if word is not None:
            words.append(word)
        if record.intermittent:
            notes.append(f"intermittent: {record.intermittent}")
    passing = [r for r in records if r.outcome in ("passed", "xpass") and r.intermittent]
    return _some_runs(_aggregate(words, notes), passing) if records else Verdict(NOT_COVERED)


def level(strict: Verdict, weak: Verdict) -> Verdict:
    """The verdict of a strict clause given its weak level's: "weak level only" where the strict clause breaks and
    its weak level passes on every run; where both break, the strict clause's word, "(weak level too)", and "(weak
    level too, on some runs)" where the weak level's pass is an intermittent entry's (it failed on other runs)."""
    if not strict.broken:
        return strict
    if weak.word == PASSES and not weak.missed:
        return strict._replace(word=WEAK_ONLY)
    if weak.missed:  # broken, or passing this time with a failure on other runs (an intermittent entry)
        too = "weak level too" if weak.broken else "weak level too, on some runs"
        return strict._replace(note="; ".join(filter(None, [strict.note, too])))
    return strict
