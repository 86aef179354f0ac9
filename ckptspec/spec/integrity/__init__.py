"""Integrity and safe loading: checkpoints damaged after commit, no code execution at load, file modes."""
