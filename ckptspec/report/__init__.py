"""ckptspec's reports: recorded runs and everything that reads them (verdicts, tables, pages, reproducer reports).

Nothing here imports torch, pytest, a target or the runner (harness_tests/test_report_without_torch.py renders
every page with torch unimportable): `pip install ckptspec` without the `test` extra installs this and the
`ckptspec report|findings` commands, and the stored runs come with it (`data/stored/`, the checkout's
`conformance/all/`). The suite writes the run record (`run_file`) and reads the clause registry and the release
list from here; nothing here imports the suite.

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
    clauses          the clause registry (ckptspec/spec/clauses/*.toml)
    installed        a checkout or an installed copy: where the configuration and the data files lie
"""
