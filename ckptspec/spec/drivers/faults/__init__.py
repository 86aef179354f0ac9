"""The fault machinery: what places a fault in a save, for the fault suite (ckptspec/faults) and the spec areas that
judge a save under a fault (protocol durability and failures, the manager's resume, pointer, preemption).

- `faultfs`: the injected file-system layer (trace a save's persistence points, fail, crash or hang at one).
- `phases`: the phases of a save (`PHASES`, `SAVE_PHASES`) and the `Step`/`Hooks` that place a fault in one.
- `crash_points`: a save in a forked world-1 child (`in_child`), crashed after each traced point of a phase.
- `preemption`: a forked save SIGTERMed while held at one of its points (`terminated`).
- `tmpdirs`: ranks run each in a private TMPDIR inside the test's audited one (`on_ranks`, `private_tmpdir`).

The time bounds the fault clauses set are `ckptspec.spec.drivers.bounds`.
"""
