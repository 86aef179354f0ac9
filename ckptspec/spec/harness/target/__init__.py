"""The target surface: how the library under test is loaded, and what its adapter offers the suite.

Modules:
    loading    Target, adapters, capabilities; how every process resolves the same target
    contract   the adapter contract, stated once as Protocols (mypy, the check at load and the docs derive from it)
    protocol   the protocol layer: five calls any asynchronous save offers
    formats    how a target's checkpoints lie on disk and are read back
    recipe     the documented async save recipe (plan_async_save), written once for every caller
    manager    the manager layer: resume, retention, the latest pointer
"""
