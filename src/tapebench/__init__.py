"""tapebench: reproducible pipeline for the TAPE cellular-automata rule-shift RL benchmark.

The package root is deliberately empty: `import tapebench.envs` registers the Gymnasium id
"tapebench/Tape-v0"; the layers are described in docs/architecture.md.
"""
__version__ = "0.1.0"
