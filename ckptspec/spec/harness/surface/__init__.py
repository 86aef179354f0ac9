"""The target surface: how the library under test is loaded, and what its adapter offers the suite.

The adapters themselves are `ckptspec.spec.targets` (one module per target); this package is the harness's side of
them. Its modules that state a contract the suite calls end in `_api`: `saver_api` is the protocol layer (the
`Saver` every target offers), `manager_api` the manager contract layer (the `CheckpointManager` a target may
offer), so neither is mistaken for the manager area (ckptspec/spec/manager/), impl's reference manager
(ckptspec.impl.manager) or an adapter's manager (ckptspec/spec/targets/_local_manager.py, _lightning_manager.py).

Modules:
    loading      Target, adapters, capabilities; how every process resolves the same target
    contract     the adapter contract, stated once as Protocols (mypy, the check at load and the docs derive from it)
    saver_api    the protocol layer: five calls any asynchronous save offers (`Saver`, `protocol_saver`)
    formats      how a target's checkpoints lie on disk and are read back
    recipe       the documented async save recipe (plan_async_save), written once for every caller
    manager_api  the manager contract layer: resume, retention, the latest pointer (`CheckpointManager`)
"""
