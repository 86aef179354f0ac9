"""ckptspec: the executable specification of async and local checkpointing."""
