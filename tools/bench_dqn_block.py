"""Env steps/s of S seeds of DQN trained as one seed block versus S single agents one after another, one process.

    PYTHONPATH=src python tools/bench_dqn_block.py [--seeds 1 4 20] [--iterations 100] [--device cpu] [--json PATH]

DQN's default Config (2 x 256 MLP, batch 128, 4 envs, one gradient step per batched env step) at L = H = 32. Each
run first fills the replay up to `learning_starts` (untimed), then times `--iterations` batched steps of
act + env step + observe + update, split into those four parts. The env part of a block steps its S per-seed
`BatchedTapeEnv`s as one batch (`StackedEnvs`), as the training loop of a block does (one by one where the envs
are on a GPU).
"""
from __future__ import annotations

import argparse
import json
import time

import torch

from tapebench.envs.batched import BatchedTapeEnv, seed_block_step
from tapebench.methods import dqn
from tapebench.methods.contract import EnvSpec
from tapebench.training.loop import seed_everything

L = H = 32
RULES = [30, 54, 90, 110]
PARTS = ("act", "env", "observe", "update")


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def build(config, seeds, device):
    agents, generators, envs = [], [], []
    for seed in seeds:
        env_seed = seed_everything(seed)
        agents.append(dqn.make(config, EnvSpec.for_tape(L, H), 1_000_000, device))
        g = torch.Generator()
        g.set_state(torch.get_rng_state())
        generators.append(g)
        envs.append(BatchedTapeEnv(config.num_envs, L=L, H=H, rules=RULES, seed=env_seed, device=device))
    return agents, generators, envs


def run_single(config, seeds, iterations, device) -> dict:
    agents, _, envs = build(config, seeds, device)
    times = dict.fromkeys(PARTS, 0.0)
    warmup = config.learning_starts // config.num_envs
    for agent, env in zip(agents, envs):
        obs = env.reset()
        for i in range(warmup + iterations):
            marks = [time.perf_counter()]
            actions = agent.act(obs)
            _sync(device), marks.append(time.perf_counter())
            next_obs, rewards, terminated, truncated, info = env.step(actions)
            _sync(device), marks.append(time.perf_counter())
            agent.observe(obs, actions, rewards, info["final_obs"], terminated, truncated)
            _sync(device), marks.append(time.perf_counter())
            agent.update()
            _sync(device), marks.append(time.perf_counter())
            obs = next_obs
            if i >= warmup:
                for part, a, b in zip(PARTS, marks, marks[1:]):
                    times[part] += b - a
    return times


def run_block(config, seeds, iterations, device) -> dict:
    agents, generators, envs = build(config, seeds, device)
    block = dqn.make_block(agents, generators)
    del agents
    times = dict.fromkeys(PARTS, 0.0)
    warmup = config.learning_starts // config.num_envs
    obs = torch.stack([e.reset() for e in envs])
    step = seed_block_step(envs)
    for i in range(warmup + iterations):
        marks = [time.perf_counter()]
        actions = block.act(obs)
        _sync(device), marks.append(time.perf_counter())
        next_obs, rewards, terminated, truncated, final_obs = step(actions)
        _sync(device), marks.append(time.perf_counter())
        block.observe(obs, actions, rewards, final_obs, terminated, truncated)
        _sync(device), marks.append(time.perf_counter())
        block.update()
        _sync(device), marks.append(time.perf_counter())
        obs = next_obs
        if i >= warmup:
            for part, a, b in zip(PARTS, marks, marks[1:]):
                times[part] += b - a
    return times


def bench(seed_counts=(1, 4, 20), iterations: int = 100, device: str = "cpu") -> list[dict]:
    """Per S: env steps/s of the block and of S singles, the speedup, and each part's seconds per env step."""
    device = torch.device(device)
    config = dqn.Config()
    rows = []
    for S in seed_counts:
        seeds = list(range(S))
        steps = S * iterations * config.num_envs
        single, block = run_single(config, seeds, iterations, device), run_block(config, seeds, iterations, device)
        row = {"seeds": S, "env_steps": steps,
               "single_steps_per_s": steps / sum(single.values()), "block_steps_per_s": steps / sum(block.values()),
               "single_us_per_step": {p: 1e6 * t / steps for p, t in single.items()},
               "block_us_per_step": {p: 1e6 * t / steps for p, t in block.items()}}
        row["speedup"] = row["block_steps_per_s"] / row["single_steps_per_s"]
        rows.append(row)
        print(f"S={S:3d}  singles {row['single_steps_per_s']:8.0f} steps/s  block {row['block_steps_per_s']:8.0f} "
              f"steps/s  speedup {row['speedup']:.2f}x   us/step single|block: "
              + "  ".join(f"{p} {row['single_us_per_step'][p]:.0f}|{row['block_us_per_step'][p]:.0f}"
                          for p in PARTS), flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 4, 20])
    parser.add_argument("--iterations", type=int, default=100, help="timed batched env steps per seed")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows = bench(args.seeds, args.iterations, args.device)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
