"""Checkpoint managers for local checkpointing."""
