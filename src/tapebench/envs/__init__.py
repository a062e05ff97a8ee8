"""Environments: the Gymnasium `TapeEnv` (one tape, numpy) and `BatchedTapeEnv` (N tapes, torch).

Importing this package registers the Gymnasium id `tapebench/Tape-v0` (`ENV_ID`) at once."""
from tapebench.gymnasium_ids import ENV_ID, register_envs

register_envs()

__all__ = ["ENV_ID", "register_envs"]
