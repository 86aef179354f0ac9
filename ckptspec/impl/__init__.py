"""Reference implementation of asynchronous checkpointing (NVRx-compatible core)."""
