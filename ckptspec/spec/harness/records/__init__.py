"""Recorded runs and everything that reads them: verdicts, tables, pages, merging, recording failures.

Nothing here imports torch, a target or the runner: `ckptspec report` works in an environment without them.

Modules:
    run_file         the conformance record as types (RunFile, PhaseRecord): written by the plugin, read by every reader
    runs             a run as the report reads it (each test by its worst phase); the command that makes one
    provenance       where a recorded run came from (versions, commit, device, command)
    releases         the release list: every target release this project judges and records
    verdicts         verdict words: what a run says about a clause
    report           the conformance table (clause x target) and its command line (also --html: results_page)
    results_page     the filterable HTML page of every clause against every run (docs/results.html)
    findings         docs/findings/<target>-<release>.md: what a release breaks, by severity
    findings_html    a findings page as self-contained HTML
    glance           the README's findings at a glance
    advice           the usage rules of findings/advice.toml and the releases each applies to
    changes          what changed between two judged releases of one target
    repro_capture    reproducer outputs, run once on the release and on impl, recorded
    repro_reports    maintainer reports for each documented or implied data-loss or hang break
    blocks           the generated blocks of Markdown files (between marker lines)
    merge_runs       a stored run completed by a rerun of some of its tests
    record_failures  expectations entries (`raises`, `match`) written from a recorded run
"""
