"""Async checkpoint core: request queue, background callers and an async ``torch.save``."""
