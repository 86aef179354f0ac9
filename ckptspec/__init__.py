"""ckptspec: the executable specification of asynchronous and local checkpointing for PyTorch training.

One import name, one room per job:

- `ckptspec.impl`: the reference implementation, with NVRx's module paths below it (`ckptspec.impl.async_ckpt.core`
  is `nvidia_resiliency_ext.checkpointing.async_ckpt.core`);
- `ckptspec.spec`: the specification suite (the clauses, their property-based tests, the target adapters, the harness);
- `ckptspec.faults`: the fault suite;
- `ckptspec.bench`: the benchmarks and the cost gate (`python -m ckptspec.bench.regression`);
- `ckptspec.migrate`: rewrites 0.2's names (its four top-level packages) in a user's adapters, expectations and runs.

The command line is `ckptspec` (or `python -m ckptspec`). Importing this package imports nothing else.
"""
