"""Environments: the Gymnasium `TapeEnv` (one tape, numpy) and `BatchedTapeEnv` (N tapes, torch)."""
from tapebench.envs.registration import ENV_ID, register_envs

__all__ = ["ENV_ID", "register_envs"]
