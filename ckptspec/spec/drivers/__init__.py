"""The driver layer: what the spec tests, the fault suite and the benchmarks all use to work a target.

Saving through a target's documented recipe (`saving`), local-checkpoint scenarios (`local`, `cpu_state_dict`),
damage planted in a committed checkpoint (`damage`), protocol saves and the protocol trainer (`protocol_saves`,
`trainer`). Drivers import the harness and never a test module; tests, `ckptspec/faults` and `benchmarks` import
drivers. The import-linter contracts in pyproject.toml hold every file to this.
"""
