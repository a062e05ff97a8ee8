"""CURL-DQN (`agents/curl_dqn.py`): bilinear InfoNCE against a momentum key encoder, added to DQN's TD loss.

* the InfoNCE loss equals a value computed by hand on a tiny batch with fixed weights (the bare function
  and through the agent's encoders);
* the key encoder gets no gradients and moves toward the query encoder by exactly the configured
  momentum after each gradient step; the target network is a copy of query encoder + Q head;
* `curl_weight` really weights the auxiliary loss (0 leaves W untouched);
* the agent learns rule 4 at L = H = 16, resumes bit-identically after SIGKILL, and evaluates greedily on
  the raw observation without touching any state.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from agent_contract import assert_per_episode_policy, assert_sigkill_resume_bit_identical, learned_success

from tapebench.methods.contract import EnvSpec
from tapebench.methods.curl_dqn import info_nce
from tapebench.registry import build_config, get_method, make_agent

AGENT = "curl_dqn"

# q_1 = (1, 0), q_2 = (0, 1); k_1 = (1, 2), k_2 = (0, 1); W = diag(1, 2)
# logits = [[q_i . W k_j]] = [[1, 0], [4, 2]]
# InfoNCE = mean(-1 + log(e^1 + e^0), -2 + log(e^4 + e^2)) = mean(log(1 + e^-1), log(1 + e^2))
HAND_VALUE = 0.5 * (math.log(1 + math.exp(-1)) + math.log(1 + math.exp(2)))   # = 1.2200948...


def test_info_nce_equals_the_hand_computed_value():
    assert HAND_VALUE == pytest.approx(1.2200948, abs=1e-7)
    query = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    key = torch.tensor([[1.0, 2.0], [0.0, 1.0]])
    W = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    assert info_nce(query, key, W).item() == pytest.approx(HAND_VALUE, abs=1e-6)
    assert info_nce(query, key, torch.zeros(2, 2)).item() == pytest.approx(math.log(2), abs=1e-7)  # untrained W


def test_agent_contrastive_loss_with_fixed_weights_equals_the_hand_computed_value():
    L = 4
    agent = make_agent(AGENT, build_config(AGENT, {"hidden_size": 2, "hidden_layers": 1}), EnvSpec.for_tape(L, L),
                       1000, "cpu")
    with torch.no_grad():
        for encoder in (agent.query_encoder, agent.key_encoder):   # features = relu([x0, x1 + x2])
            encoder[0].weight.copy_(torch.tensor([[1.0, 0, 0, 0, 0], [0, 1.0, 1.0, 0, 0]]))
            encoder[0].bias.zero_()
        agent.W.copy_(torch.tensor([[1.0, 0.0], [0.0, 2.0]]))
    anchor = torch.tensor([[1.0, 0, 0, 0, 0.25], [0, 1.0, 0, 0, 0.5]])     # queries (1, 0), (0, 1)
    positive = torch.tensor([[1.0, 1, 1, 0, 0.25], [0, 0, 1.0, 1, 0.5]])   # keys (1, 2), (0, 1)
    assert agent.contrastive_loss(agent.query_encoder(anchor), positive).item() == pytest.approx(HAND_VALUE, abs=1e-6)


def filled_agent(overrides: dict, L: int = 8, n: int = 256, seed: int = 0):
    torch.manual_seed(seed)
    config = build_config(AGENT, {"hidden_size": 16, "batch_size": 32, "learning_starts": 0, **overrides})
    agent = make_agent(AGENT, config, EnvSpec.for_tape(L, L), 10_000, "cpu")
    obs = torch.cat([torch.randint(0, 2, (n, L)).float(), torch.rand(n, 1)], dim=1)
    next_obs = torch.cat([torch.randint(0, 2, (n, L)).float(), torch.rand(n, 1)], dim=1)
    agent.observe(obs, torch.randint(0, L, (n,)), -torch.rand(n), next_obs, torch.rand(n) < 0.1,
                  torch.zeros(n, dtype=torch.bool))
    return agent


def snapshot(module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in module.parameters()]


@pytest.mark.parametrize("augment_td", [True, False])
def test_key_encoder_moves_toward_the_query_encoder_by_the_momentum_and_gets_no_gradients(augment_td):
    m = 0.9
    agent = filled_agent({"key_momentum": m, "augment_td": augment_td})
    assert all(not p.requires_grad for p in agent.key_encoder.parameters())
    optimised = {id(p) for group in agent.optimizer.param_groups for p in group["params"]}
    assert not optimised & {id(p) for p in agent.key_encoder.parameters()}
    assert {id(p) for p in agent.query_encoder.parameters()} <= optimised and id(agent.W) in optimised
    for step in range(3):
        key_before, query_before = snapshot(agent.key_encoder), snapshot(agent.query_encoder)
        agent._gradient_step()
        key_after, query_after = snapshot(agent.key_encoder), snapshot(agent.query_encoder)
        assert any(not torch.equal(a, b) for a, b in zip(query_before, query_after))   # the query learned
        for k0, k1, q1, p in zip(key_before, key_after, query_after, agent.key_encoder.parameters()):
            assert p.grad is None
            assert torch.allclose(k1, m * k0 + (1 - m) * q1, atol=1e-7, rtol=0)
            assert torch.linalg.norm(k1 - q1) == pytest.approx(m * torch.linalg.norm(k0 - q1).item(), rel=1e-4)


def test_key_momentum_one_freezes_the_key_encoder_and_zero_copies_the_query():
    frozen = filled_agent({"key_momentum": 1.0})
    start = snapshot(frozen.key_encoder)
    for _ in range(3):
        frozen._gradient_step()
    assert all(torch.equal(a, b) for a, b in zip(start, snapshot(frozen.key_encoder)))
    copied = filled_agent({"key_momentum": 0.0})
    copied._gradient_step()
    assert all(torch.equal(a, b) for a, b in zip(snapshot(copied.key_encoder), snapshot(copied.query_encoder)))


def test_q_head_sits_on_the_query_encoder_and_the_target_network_copies_both():
    agent = filled_agent({"target_update_frequency": 64, "train_frequency": 8})   # 256 env steps observed
    obs = torch.rand(5, 9)
    assert torch.equal(agent.q_network(obs), agent.q_network[-1](agent.query_encoder(obs)))
    assert all(a is b for a, b in zip(agent.query_encoder.parameters(), list(agent.q_network.parameters())[:-2]))
    agent.update()                        # 32 gradient steps, then the target copy due at env step 256
    assert agent.gradient_steps == 32
    assert all(torch.equal(t, q) for t, q in zip(agent.target_network.parameters(), agent.q_network.parameters()))
    agent._gradient_step()                # a copy, not shared weights
    assert not all(torch.equal(t, q) for t, q in zip(agent.target_network.parameters(), agent.q_network.parameters()))


def test_curl_weight_scales_the_auxiliary_loss():
    without = filled_agent({"curl_weight": 0.0})
    with_curl = filled_agent({"curl_weight": 1.0})
    for _ in range(5):
        metrics_without = without._gradient_step()
        with_curl._gradient_step()
    assert torch.equal(without.W, torch.zeros_like(without.W))      # no InfoNCE gradient, so W never moves
    assert not torch.equal(with_curl.W, torch.zeros_like(with_curl.W))
    assert metrics_without["curl_loss"] > 0 and "td_loss" in metrics_without


def test_registry_entry_and_defaults_match_dqn():
    method = get_method(AGENT)
    assert (method.display_name, method.family, method.trains) == ("DQN + CURL", "augmentation", True)
    curl, dqn = build_config(AGENT, {}), build_config("dqn", {})
    for name, value in vars(dqn).items():
        assert getattr(curl, name) == value, name


@pytest.mark.parametrize("bad,field", [({"key_momentum": 1.5}, "key_momentum"), ({"curl_weight": -1.0}, "curl_weight"),
                                       ({"flip_prob": 0.7}, "flip_prob")])
def test_config_rejects_bad_values(bad, field):
    with pytest.raises(ValueError, match=field):
        build_config(AGENT, bad)


def test_greedy_action_is_argmax_q_on_the_raw_observation_and_changes_no_state():
    agent = filled_agent({})
    agent._gradient_step()
    obs = torch.cat([torch.randint(0, 2, (64, 8)).float(), torch.rand(64, 1)], dim=1)
    rng = torch.get_rng_state()
    actions = agent.act(obs, greedy=True)
    assert torch.equal(torch.get_rng_state(), rng)
    assert torch.equal(actions, agent.q_network(obs).argmax(1))
    assert_per_episode_policy(lambda: (lambda o: agent.act(o, greedy=True)))


def test_learns_fixed_rule_4(tmp_path):
    untrained, trained = learned_success(AGENT, 4, 16, 16, 8_000, tmp_path, {})
    assert untrained < 0.9 and trained >= 0.9, (untrained, trained)


def test_sigkill_resume_is_bit_identical(tmp_path):
    params = {"agent": {"num_envs": 4, "hidden_size": 32, "learning_starts": 200, "target_update_frequency": 200},
              "env": {"L": 8, "H": 8}, "training": {"total_steps": 1200, "eval_every": 300}}
    assert_sigkill_resume_bit_identical(AGENT, params, tmp_path)
