"""Checkpoint files of a training run, written atomically.

`<run>/checkpoints/step_XXXXXXX.pt` — an evaluation checkpoint: agent name, resolved
hyperparameters, env spec, env steps trained, provenance and the greedy policy's weights
(`agent.policy_state_dict()`): enough to rebuild the policy with `load_policy`.

`<run>/resume.pt` — the full training state after the last checkpoint: agent state (networks,
optimiser, replay buffer / partial rollout), environment state (tapes, rules, step counters, the
rows' init_density / noise when the environment has them, and the env generator), the torch / numpy /
python RNG states, the loop counters and the run fingerprint.

Files are serialised to memory first, so the same content always gives the same bytes
(torch.save embeds the file name in the archive otherwise). `save` returns the file's sha256, which
train.json records per checkpoint so a damaged checkpoint is caught before it is used.
"""
from __future__ import annotations

import dataclasses
import hashlib
import io
import random
from pathlib import Path

import numpy as np
import torch

from tapebench.layout import CHECKPOINT_DIR, LOG_FILE, MANIFEST_FILE, RESUME_FILE  # re-exported: ckpt.MANIFEST_FILE
from tapebench.methods.contract import EnvSpec
from tapebench.registry import build_config, get_method
from tapebench.utils.artifacts import CorruptArtifact, file_sha256
from tapebench.utils.io import atomic_path

FORMAT_VERSION = 1


def checkpoint_name(env_steps: int) -> str:
    return f"{CHECKPOINT_DIR}/step_{int(env_steps):07d}.pt"


def save(path, obj) -> str:
    """Write `obj` atomically; returns the sha256 of the bytes written."""
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    data = buffer.getvalue()
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
    return hashlib.sha256(data).hexdigest()


def load(path, map_location="cpu", sha256: str | None = None):
    """Load a checkpoint or resume file; a damaged one (or one whose bytes differ from `sha256`)
    raises CorruptArtifact naming the file and how to recover."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint file not found: {path}")
    if sha256 is not None and file_sha256(path) != sha256:
        raise CorruptArtifact(path, "its bytes differ from the sha256 recorded when it was written")
    try:
        # our own files: they hold numpy/python RNG states, which weights_only loading refuses
        payload = torch.load(path, map_location=map_location, weights_only=False)
    except Exception as exc:  # torch raises RuntimeError, EOFError, UnpicklingError, ... for damaged files
        raise CorruptArtifact(path, f"torch cannot load it: {type(exc).__name__}: "
                                    f"{(str(exc).splitlines() or [''])[0][:160]}") from None
    if not isinstance(payload, dict) or "format" not in payload:
        raise CorruptArtifact(path, "not a tapebench checkpoint")
    return payload


def verify_checkpoints(run_dir, entries, listed_in: str = MANIFEST_FILE) -> None:
    """Every checkpoint listed in `listed_in` (train.json or resume.pt) exists and is intact: its
    sha256 when recorded, else it loads. Raises CorruptArtifact naming the file."""
    run_dir = Path(run_dir)
    for entry in entries:
        path = run_dir / entry["file"]
        if not path.is_file():
            raise CorruptArtifact(run_dir / listed_in, f"it lists {entry['file']}, which is gone")
        if entry.get("sha256"):
            if file_sha256(path) != entry["sha256"]:
                raise CorruptArtifact(path, f"its bytes differ from the sha256 recorded in {listed_in}")
        else:
            load(path)


# --- RNG and environment state -------------------------------------------------------------------
def rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def env_state(env) -> dict:
    # rule ids of families beyond int64 are positions in the env's rule list: store the numbers instead
    family = getattr(env, "family", None)
    rules = env.rules.cpu().clone() if family is None or family.fits_int64 else env.row_rules()
    state = {"tapes": env.tapes.cpu().clone(), "rules": rules, "t": env.t.cpu().clone(),
             "generator": env.generator.get_state()}
    if env.nuisances:   # per-row rho and epsilon (domain randomisation); absent with the defaults
        state["init_density"] = env.row_density.clone()
        state["noise"] = env.row_noise.clone()
    if getattr(env, "goal_sampler", None) is not None:   # derived training goals: the rows' goals, the sampler's counts
        state["goals"] = env.row_goals().cpu().clone()
        state["goal_sampler"] = env.goal_sampler.state_dict()
    return state


def load_env_state(env, state: dict) -> None:
    """Restore through the env's public `load` (tapes, rules), then the step counters and generator."""
    if tuple(state["tapes"].shape) != (env.num_envs, env.L):
        raise ValueError(f"resume state has {tuple(state['tapes'].shape)} tapes, the environment "
                         f"{(env.num_envs, env.L)}")
    sampler = getattr(env, "goal_sampler", None)
    if (sampler is not None) != ("goals" in state):
        raise ValueError("resume state and environment disagree on derived training goals (env.goal): the state "
                         f"{'has' if 'goals' in state else 'has no'} per-row goals")
    if sampler is None:
        env.load(state["tapes"], state["rules"])
    else:
        env.load(state["tapes"], state["rules"], goals=state["goals"])
        sampler.load_state_dict(state["goal_sampler"])
    env.t.copy_(state["t"].to(env.device))
    if env.nuisances:
        if "noise" not in state:
            raise ValueError("resume state has no per-row init_density/noise, but the environment has "
                             f"init_density={env.init_density} and noise={env.noise}")
        env.row_density.copy_(state["init_density"])
        env.row_noise.copy_(state["noise"])
    env.generator.set_state(state["generator"])


# --- evaluation checkpoints ----------------------------------------------------------------------
def policy_checkpoint(agent_name: str, config, env_spec, agent, env_steps: int, total_steps: int,
                      seed: int, provenance: dict) -> dict:
    return {
        "format": FORMAT_VERSION,
        "agent": agent_name,
        "hyperparameters": dataclasses.asdict(config),
        "env_spec": env_spec.as_dict(),
        "env_steps": int(env_steps),
        "total_steps": int(total_steps),
        "seed": int(seed),
        "provenance": provenance,
        "policy": agent.policy_state_dict(),
    }


def build_policy_agent(payload: dict, device="cpu"):
    """An agent (from the registry) ready to hold the policy weights of checkpoints like `payload`."""
    config = build_config(payload["agent"], payload["hyperparameters"])
    env_spec = EnvSpec(**payload["env_spec"])
    return get_method(payload["agent"]).make_agent(config, env_spec, payload["total_steps"], device)


def load_policy(path, device="cpu"):
    """(agent with the checkpoint's greedy policy loaded, checkpoint metadata without the weights)."""
    payload = load(path)
    agent = build_policy_agent(payload, device)
    agent.load_policy_state_dict(payload["policy"])
    return agent, {k: v for k, v in payload.items() if k != "policy"}
