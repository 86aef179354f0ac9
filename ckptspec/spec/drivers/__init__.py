"""The driver layer: what the spec tests, the fault suite and the benchmarks all use to work a target.

Saving through a target's documented recipe (`saving`), local-checkpoint scenarios (`local`, `cpu_state_dict`),
damage planted in a committed checkpoint (`damage`), protocol saves and the protocol trainer (`protocol_saves`,
`trainer`), manager saves (`manager_saves`), the clauses' time bounds (`bounds`), and the fault machinery
(`faults/`). Drivers import the harness and never a test module; the spec areas, `ckptspec/faults` and
`ckptspec/bench` import drivers, and never one another. The import-linter contracts in pyproject.toml hold every file to this.
"""
