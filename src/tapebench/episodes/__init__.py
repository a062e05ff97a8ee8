"""Evaluation episodes and the random streams every method draws from (docs/protocol.md#decisions)."""
