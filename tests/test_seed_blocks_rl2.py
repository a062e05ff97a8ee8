"""RL2-A2C's seed block (`rl2_a2c.make_block`): S seeds as one stacked model (stacked GRU cells included) give, on
the CPU, each seed's one-seed run bit for bit (complete training state, checkpoints, generator, metrics), whatever
its neighbours."""
from __future__ import annotations

import dataclasses
import io

import pytest
import torch

from tapebench.envs.batched import BatchedTapeEnv
from tapebench.methods import rl2_a2c, stacked
from tapebench.methods.contract import EnvSpec
from tapebench.registry import get_method
from tapebench.training.loop import seed_everything

L, H = 8, 8
SPEC = EnvSpec.for_tape(L, H)
# 32 env steps per update: four updates and a half-full rollout (the exported rollout and optimiser state count)
CONFIG = rl2_a2c.Config(num_envs=4, num_steps=8, hidden_size=16)
STEPS = 4 * 32 + 16

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def build(config, seeds, device="cpu"):
    """The agents and generators the training loop builds for a block of `seeds`, and each seed's env seed."""
    agents, generators, env_seeds = [], [], []
    for seed in seeds:
        env_seeds.append(seed_everything(seed))
        agents.append(rl2_a2c.make(config, SPEC, STEPS, device))
        generator = torch.Generator()
        generator.set_state(torch.get_rng_state())
        generators.append(generator)
    return agents, generators, env_seeds


def env(config, env_seed):
    return BatchedTapeEnv(config.num_envs, L=L, H=H, rules=[0, 4, 30, 90, 110], seed=env_seed)


def train_alone(config, seed, steps=STEPS):
    """A one-seed run as the training loop drives it; also how many episodes ended by success and by truncation
    before a rollout's last step (a hidden state reset inside the BPTT replay)."""
    env_seed = seed_everything(seed)
    agent = rl2_a2c.make(config, SPEC, STEPS, "cpu")
    e = env(config, env_seed)
    obs, metrics, ends = e.reset(), [], {"terminated": 0, "truncated": 0}
    for _ in range(steps // config.num_envs):
        actions = agent.act(obs)
        next_obs, rewards, terminated, truncated, info = e.step(actions)
        if agent.rollout.position < config.num_steps - 1:
            ends["terminated"] += int(terminated.sum())
            ends["truncated"] += int(truncated.sum())
        agent.observe(obs, actions, rewards, info["final_obs"], terminated, truncated)
        metrics.append(agent.update())
        obs = next_obs
    return agent, metrics, ends


def train_block(config, seeds, steps=STEPS):
    agents, generators, env_seeds = build(config, seeds)
    block = rl2_a2c.make_block(agents, generators)
    envs = [env(config, s) for s in env_seeds]
    obs, metrics = torch.stack([e.reset() for e in envs]), []
    for _ in range(steps // config.num_envs):
        actions = block.act(obs)
        out = [e.step(a) for e, a in zip(envs, actions)]
        next_obs, rewards, terminated, truncated = (torch.stack([o[i] for o in out]) for i in range(4))
        final = torch.stack([o[4]["final_obs"] for o in out])
        block.observe(obs, actions, rewards, final, terminated, truncated)
        metrics.append(block.update())
        obs = next_obs
    return block, agents, metrics


def saved(state) -> bytes:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


@pytest.mark.parametrize("overrides", [{}, {"norm_adv": False, "anneal_lr": False, "hidden_size": 8}])
def test_each_seed_of_a_block_is_its_one_seed_run_bit_for_bit(overrides):
    config = dataclasses.replace(CONFIG, **overrides)
    seeds = [0, 1, 2]
    block, agents, block_metrics = train_block(config, seeds)
    for k, seed in enumerate(seeds):
        alone, alone_metrics, ends = train_alone(config, seed)
        assert alone.updates_done == 4 and alone.rollout.position == config.num_steps // 2
        assert ends["terminated"] > 0 and ends["truncated"] > 0
        block.export_seed(k, agents[k])
        assert saved(agents[k].state_dict()) == saved(alone.state_dict())   # the same resume file, byte for byte
        assert saved(agents[k].policy_state_dict()) == saved(alone.policy_state_dict())
        assert torch.equal(block.generators[k].get_state(), torch.get_rng_state())
        assert [m[k] for m in block_metrics] == alone_metrics
