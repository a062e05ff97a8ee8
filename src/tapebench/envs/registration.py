"""Gymnasium registration of tapebench/Tape-v0."""
ENV_ID = "tapebench/Tape-v0"


def register_envs() -> None:
    import gymnasium

    if ENV_ID not in gymnasium.registry:
        gymnasium.register(id=ENV_ID, entry_point="tapebench.envs.tape_env:TapeEnv")
