"""Local checkpointing: per-rank parts on node-local storage, optionally replicated within rank cliques.

Module layout mirrors ``nvidia_resiliency_ext.checkpointing.local``.
"""
