"""The equivariant networks on the 2D family's torus (`EnvSpec.for_grid`, docs/methods.md#equivariant-networks):

* rolling the grid by (dy, dx) rolls the per-cell outputs (policy logits, Q-values) by (dy, dx) and leaves PPO's
  value unchanged, for every translation of the torus; the tape trunk on the same flattened cells is not
  equivariant under column shifts (so the check can fail);
* a trunk that cannot see the whole grid is refused, naming the grid's side;
* PPO (equivariant) trains a few hundred steps on the batched grid environment; DQN, PEARL-DQN and the ensemble
  MPC with equivariant networks act, observe and take gradient steps on it;
* seed blocks: a PPO block of 2D networks is, on the CPU, each seed's one-seed run bit for bit; DQN's stacked
  per-cell network computes its one-seed networks' Q-values bit for bit.
"""
from __future__ import annotations

import pytest
import torch
from agent_contract import tensors_equal

from tapebench.envs.grid_batched import BatchedGridEnv
from tapebench.methods import equivariant, ppo, stacked
from tapebench.methods.contract import EnvSpec
from tapebench.registry import build_config, make_agent

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SMALL = {"conv_channels": 8, "conv_layers": 3}
RULES = ("B3/S23", "B36/S23", "B2/S")
PPO_SMALL = {**SMALL, "num_envs": 4, "num_steps": 16, "num_minibatches": 2, "update_epochs": 2}


def grid_observations(n: int, rows: int = 5) -> torch.Tensor:
    g = torch.Generator().manual_seed(n)
    grids = torch.randint(0, 2, (rows, n * n), generator=g).double()
    return torch.cat([grids, torch.rand(rows, 1, generator=g, dtype=torch.float64)], dim=1)


def roll_grid(obs: torch.Tensor, dy: int, dx: int, n: int) -> torch.Tensor:
    """Roll the grid part of (N, n·n [+ ...]) rows by (dy, dx) on the torus (cells row-major)."""
    cells = obs[:, :n * n].reshape(-1, n, n).roll((dy, dx), dims=(1, 2)).reshape(-1, n * n)
    return torch.cat([cells, obs[:, n * n:]], dim=1)


def max_translation_error(f, obs: torch.Tensor, n: int, shifts) -> float:
    """The largest |f(roll obs) - roll f(obs)| over `shifts` (per-row outputs: |f(roll obs) - f(obs)|)."""
    with torch.no_grad():
        out = f(obs)
        errors = []
        for dy, dx in shifts:
            want = roll_grid(out, dy, dx, n) if out.dim() == 2 else out
            errors.append(float((f(roll_grid(obs, dy, dx, n)) - want).abs().max()))
    return max(errors)


def grid_networks(agent_id: str, spec: EnvSpec, overrides: dict) -> dict:
    torch.manual_seed(2)
    agent = make_agent(agent_id, build_config(agent_id, {**SMALL, **overrides}), spec, 1000, "cpu")
    if hasattr(agent, "q_network"):
        return {"Q": agent.q_network.double()}
    agent.network.double()
    return {"logits": agent.network.actor, "value": lambda obs: agent.network.critic(obs).squeeze(-1)}


@pytest.mark.parametrize("n", [5, 8])
@pytest.mark.parametrize("agent_id,global_pool", [("ppo_equivariant", True), ("ppo_equivariant", False),
                                                  ("dqn_equivariant", True)])
def test_rolling_the_grid_rolls_the_per_cell_outputs_and_keeps_the_value(agent_id, global_pool, n):
    spec = EnvSpec.for_grid(n, 32)
    obs = grid_observations(n)
    every = [(dy, dx) for dy in range(n) for dx in range(n)]
    for name, f in grid_networks(agent_id, spec, {"global_pool": global_pool}).items():
        assert max_translation_error(f, obs, n, every) < 1e-10, name
        out = f(obs).detach()
        assert out.shape == ((len(obs), n * n) if name != "value" else (len(obs),)), name
        if out.dim() == 2:   # not vacuous: the outputs differ between cells and between rows
            assert float(out.std(dim=1).min()) > 1e-4, name
        assert float(out.std(dim=0).max()) > 1e-6, name


def test_the_tape_trunk_on_the_flattened_grid_is_not_translation_equivariant():
    # the 1-D trunk over the row-major cells commutes with whole-row shifts (a roll by n cells) only
    n = 5
    obs = grid_observations(n)
    tape = grid_networks("ppo_equivariant", EnvSpec.for_tape(n * n, 32), {})["logits"]
    assert max_translation_error(tape, obs, n, [(1, 0), (2, 0)]) < 1e-10
    assert max_translation_error(tape, obs, n, [(0, 1)]) > 1e-3


def test_the_grid_trunk_runs_2d_convolutions_and_is_refused_where_it_cannot_see_the_grid():
    spec = EnvSpec.for_grid(8, 32)
    config = build_config("dqn_equivariant", {"global_pool": False, "conv_layers": 1})   # sees 3 x 3 cells
    with pytest.raises(ValueError, match=r"sees 3 cells along each axis .* fewer than the grid's side n = 8"):
        make_agent("dqn_equivariant", config, spec, 100, "cpu")
    trunk = equivariant.trunk(build_config("dqn_equivariant", {"conv_kernel": 5}), spec)
    assert trunk.grid == 8 and [conv.conv.kernel_size for conv in trunk.convs] == [(5, 5)] * equivariant.LAYERS
    assert [conv.conv.dilation for conv in trunk.convs] == [(2 ** i, 2 ** i) for i in range(equivariant.LAYERS)]
    with pytest.raises(ValueError, match="needs L = n \\* n cells, got L = 10 for n = 3"):
        equivariant.EquivariantTrunk(10, 4, 2, grid=3)


@pytest.mark.parametrize("n,kernel_size", [(5, 3), (8, 3), (4, 5)])
def test_the_grid_convolution_is_the_dilated_circular_convolution_at_every_dilation(n, kernel_size):
    # dilations past the side wrap (d mod n; a multiple of n reads the cell itself): still the plain dilated map
    torch.manual_seed(0)
    x = torch.randn(3, 4, n * n, dtype=torch.float64)
    half = kernel_size // 2
    for dilation in (1, 2, 3, 4, 8, 16, 2 * n):
        conv = equivariant.CircularConv(4, 6, kernel_size, dilation, grid=n).double()
        weight, bias, grid = conv.conv.weight, conv.conv.bias, x.unflatten(-1, (n, n))
        want = bias.view(1, -1, 1, 1).expand(3, -1, n, n).clone()
        for j in range(kernel_size):
            for k in range(kernel_size):   # output (r, s) reads (r + d·(j - half), s + d·(k - half)) mod n
                shifted = torch.roll(grid, (-dilation * (j - half), -dilation * (k - half)), dims=(-2, -1))
                want += torch.einsum("oi,nirs->nors", weight[:, :, j, k], shifted)
        with torch.no_grad():
            assert float((conv(x) - want.flatten(2)).abs().max()) < 1e-12, dilation


def transition(env: BatchedGridEnv, actions: torch.Tensor):
    """One step; `next_obs` the true successor (the finished episode's last observation on rows that ended)."""
    obs, rewards, terminated, truncated, info = env.step(actions)
    return obs, rewards, info["final_obs"], terminated, truncated


def drive(agent, env: BatchedGridEnv, steps: int) -> tuple[torch.Tensor, list]:
    """`steps` batched steps of the training loop's contract (act, observe the true successor, update); every action
    a cell of the grid. Returns the last observation and each step's update metrics."""
    obs, metrics = env.reset(), []
    for _ in range(steps):
        actions = agent.act(obs)
        assert actions.shape == (env.num_envs,) and 0 <= int(actions.min()) and int(actions.max()) < env.L
        next_obs, rewards, final_obs, terminated, truncated = transition(env, actions)
        agent.observe(obs, actions, rewards, final_obs, terminated, truncated)
        metrics.append(agent.update())
        obs = next_obs
    return obs, metrics


def test_equivariant_ppo_trains_on_the_batched_grid_env():
    spec = EnvSpec.for_grid(8, 32)
    config = build_config("ppo_equivariant", {**SMALL, "num_envs": 8, "num_steps": 32})
    torch.manual_seed(0)
    agent = ppo.make(config, spec, total_steps=768, device="cpu")
    before = [p.detach().clone() for p in agent.network.parameters()]
    env = BatchedGridEnv(config.num_envs, n=8, H=32, rules=RULES, seed=0)
    obs, metrics = drive(agent, env, 768 // config.num_envs)
    updates = [m for m in metrics if m]
    assert len(updates) == 3 and all(torch.isfinite(torch.tensor(list(m.values()))).all() for m in updates)
    assert all(not torch.equal(a, b) for a, b in zip(before, agent.network.parameters()))
    assert agent.act(obs, greedy=True).shape == (8,)


@pytest.mark.parametrize("agent_id,overrides", [
    ("dqn_equivariant", {"learning_starts": 64}), ("pearl_dqn_equivariant", {"learning_starts": 64}),
    ("ensemble_mpc_equivariant", {"learning_starts": 64, "ensemble_size": 2, "candidates": 16, "plan_horizon": 3})])
def test_the_other_equivariant_rows_act_observe_and_learn_on_the_batched_grid_env(agent_id, overrides):
    spec = EnvSpec.for_grid(6, 8)
    config = build_config(agent_id, {**SMALL, **overrides, "num_envs": 4})
    torch.manual_seed(0)
    agent = make_agent(agent_id, config, spec, 400, "cpu")
    _, learned = drive(agent, BatchedGridEnv(config.num_envs, n=6, H=8, rules=RULES, seed=0), 100 // config.num_envs)
    losses = [value for metrics in learned for key, value in metrics.items() if "loss" in key]
    assert losses and all(torch.isfinite(torch.tensor(losses))), agent_id


def test_a_ppo_block_on_the_grid_is_each_seeds_one_seed_run_bit_for_bit():
    spec, seeds, steps = EnvSpec.for_grid(6, 8), [0, 5], 40   # two updates of 64 steps and a partial rollout
    config = build_config("ppo_equivariant", PPO_SMALL)

    def built(seed):
        torch.manual_seed(seed)
        return ppo.make(config, spec, total_steps=steps * config.num_envs, device="cpu")

    agents, generators = [], []
    for seed in seeds:
        agents.append(built(seed))
        generators.append(torch.Generator().set_state(torch.get_rng_state()))
    block = ppo.make_block(agents, generators)
    envs = [BatchedGridEnv(config.num_envs, n=6, H=8, rules=RULES, seed=seed) for seed in seeds]
    obs = torch.stack([env.reset() for env in envs])
    for _ in range(steps):
        actions = block.act(obs)
        out = [transition(env, actions[k]) for k, env in enumerate(envs)]
        next_obs, rewards, final_obs, terminated, truncated = (torch.stack(t) for t in zip(*out))
        block.observe(obs, actions, rewards, final_obs, terminated, truncated)
        block.update()
        obs = next_obs
    for k, seed in enumerate(seeds):
        one = built(seed)
        drive(one, BatchedGridEnv(config.num_envs, n=6, H=8, rules=RULES, seed=seed), steps)
        exported = built(seed)
        block.export_seed(k, exported)
        assert one.updates_done == 2
        assert tensors_equal(exported.state_dict(), one.state_dict()), f"seed {seed}"


def test_dqns_stacked_per_cell_network_on_the_grid_is_its_one_seed_networks():
    spec = EnvSpec.for_grid(5, 8)
    networks = []
    for seed in (0, 1, 2):
        torch.manual_seed(seed)
        networks.append(make_agent("dqn_equivariant", build_config("dqn_equivariant", SMALL), spec, 100,
                                   "cpu").q_network)
    parameters = stacked.stack_parameters(networks, requires_grad=True)
    block = stacked.stacked_network(parameters, networks[0])
    obs = torch.stack([grid_observations(5, rows=4).float() for _ in networks])
    q = block(obs)
    for k, network in enumerate(networks):
        assert torch.equal(q[k], network(obs[k]))
