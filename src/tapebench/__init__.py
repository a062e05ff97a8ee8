"""tapebench: reproducible pipeline for the TAPE cellular-automata rule-shift RL benchmark."""
__version__ = "0.1.0"

from tapebench.envs.registration import register_envs

register_envs()
