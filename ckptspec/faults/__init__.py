"""The fault-injection suite: faults x phases of a save, checked against the FI-* clauses."""
