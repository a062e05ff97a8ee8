"""Gymnasium registration of tapebench/Tape-v0."""
ENV_ID = "tapebench/Tape-v0"


def register_envs() -> None:
    # gymnasium: loaded only when the environment is registered
    import gymnasium

    if ENV_ID not in gymnasium.registry:
        gymnasium.register(id=ENV_ID, entry_point="tapebench.envs.tape_env:TapeEnv")
