"""Environments: the Gymnasium `TapeEnv` (one tape, numpy) and `BatchedTapeEnv` (N tapes, torch); for n × n
torus grids `GridEnv` (`grid_env`) and `BatchedGridEnv` (`grid_batched`).

Importing this package registers the Gymnasium ids `tapebench/Tape-v0` (`ENV_ID`) and `tapebench/Grid-v0`
(`GRID_ENV_ID`) at once."""
from tapebench.gymnasium_ids import ENV_ID, GRID_ENV_ID, register_envs

register_envs()

__all__ = ["ENV_ID", "GRID_ENV_ID", "register_envs"]
