"""Replication of local checkpoint parts between ranks."""
