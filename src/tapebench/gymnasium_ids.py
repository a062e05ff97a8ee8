"""The Gymnasium ids `tapebench/Tape-v0` (tapes) and `tapebench/Grid-v0` (n × n torus grids), registered by
`import tapebench` as `import minigrid` registers its ids.

Gymnasium costs about 0.1 s to import, more than the whole `tapebench --help`, and most jobs never use it, so
the package root does not import it: if Gymnasium is already loaded the id is registered at once, otherwise a
finder on `sys.meta_path` registers it right after Gymnasium's own module runs, whenever that happens. The
entry points are strings, so registering imports neither the environment nor NumPy beyond what Gymnasium loads.
"""
import sys

ENV_ID = "tapebench/Tape-v0"
ENTRY_POINT = "tapebench.envs.tape_env:TapeEnv"
GRID_ENV_ID = "tapebench/Grid-v0"
GRID_ENTRY_POINT = "tapebench.envs.grid_env:GridEnv"


def register_envs() -> None:
    """Register `ENV_ID` and `GRID_ENV_ID` with Gymnasium (imports Gymnasium; a second call does nothing)."""
    # gymnasium: loaded only when the environment is registered
    import gymnasium

    for env_id, entry_point in ((ENV_ID, ENTRY_POINT), (GRID_ENV_ID, GRID_ENTRY_POINT)):
        if env_id not in gymnasium.registry:
            gymnasium.register(id=env_id, entry_point=entry_point)


class _RegisterAfter:
    """Gymnasium's own loader, then `register_envs()` (a loader by protocol: `create_module`, `exec_module`)."""

    def __init__(self, loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        module.__loader__ = module.__spec__.loader = self.loader
        self.loader.exec_module(module)
        register_envs()


class _WhenGymnasiumLoads:
    """A `sys.meta_path` finder (by protocol: `find_spec`) that finds nothing itself: it wraps the loader the
    other finders give for `gymnasium`, once."""

    def find_spec(self, name, path=None, target=None):
        if name != "gymnasium":
            return None
        # importlib.util: loaded only when Gymnasium is imported, not by `import tapebench`
        import importlib.util

        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None:
            spec.loader = _RegisterAfter(spec.loader)
        return spec


def register_on_import() -> None:
    """Register the ids now if Gymnasium is loaded, else as soon as it is imported."""
    if "gymnasium" in sys.modules:
        register_envs()
    elif not any(isinstance(finder, _WhenGymnasiumLoads) for finder in sys.meta_path):
        sys.meta_path.insert(0, _WhenGymnasiumLoads())
