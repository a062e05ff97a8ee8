"""The agents' Adam (`methods.common.Adam`) is `torch.optim.Adam(..., fused=True)` bit for bit: the same parameters
after every step, the same state, state dicts that load into each other, and learning-rate annealing through
`param_groups`."""
from __future__ import annotations

import io

import pytest
import torch

from tapebench.methods.common import Adam, adam


def _net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(7, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))


def _train(net, optimiser, batches, anneal=False):
    for t, x in enumerate(batches):
        if anneal:
            optimiser.param_groups[0]["lr"] = 1e-2 * (1.0 - t / len(batches))
        optimiser.zero_grad()
        net(x).pow(2).mean().backward()
        optimiser.step()


def _reloaded(state: dict) -> dict:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer)


@pytest.mark.parametrize("anneal", [False, True])
def test_adam_is_torchs_fused_adam_bit_for_bit_and_resumes_from_either_state(anneal):
    torch.manual_seed(1)
    batches = [torch.randn(32, 7) for _ in range(30)]
    ours, theirs = _net(), _net()
    ours_opt = adam(ours.parameters(), lr=1e-2)
    theirs_opt = torch.optim.Adam(theirs.parameters(), lr=1e-2, eps=1e-8, fused=True)
    _train(ours, ours_opt, batches[:20], anneal)
    _train(theirs, theirs_opt, batches[:20], anneal)
    assert all(torch.equal(a, b) for a, b in zip(ours.parameters(), theirs.parameters()))
    mine, torchs = ours_opt.state_dict(), theirs_opt.state_dict()
    assert mine["param_groups"] == torchs["param_groups"] and mine["state"].keys() == torchs["state"].keys()
    for i, state in torchs["state"].items():
        for key, value in state.items():
            assert torch.equal(mine["state"][i][key], value) and mine["state"][i][key].dtype == value.dtype

    # resume: ours from torch's state, torch's from ours, both continue exactly as the uninterrupted run
    ours_resumed, theirs_resumed = _net(), _net()
    ours_resumed.load_state_dict(ours.state_dict())
    theirs_resumed.load_state_dict(theirs.state_dict())
    ours_resumed_opt = Adam(ours_resumed.parameters(), lr=1e-2, eps=1e-8)
    ours_resumed_opt.load_state_dict(_reloaded(torchs))
    theirs_resumed_opt = torch.optim.Adam(theirs_resumed.parameters(), lr=1e-2, eps=1e-8, fused=True)
    theirs_resumed_opt.load_state_dict(_reloaded(mine))
    for net, optimiser in ((ours_resumed, ours_resumed_opt), (theirs_resumed, theirs_resumed_opt), (theirs, theirs_opt)):
        _train(net, optimiser, batches[20:])
    for a, b, c in zip(ours_resumed.parameters(), theirs_resumed.parameters(), theirs.parameters()):
        assert torch.equal(a, c) and torch.equal(b, c)


def test_a_state_for_other_parameters_is_refused():
    optimiser = adam(_net().parameters(), lr=1e-3)
    other = torch.optim.Adam(torch.nn.Linear(2, 2).parameters(), lr=1e-3).state_dict()
    with pytest.raises(ValueError, match="optimiser state for 2 parameters, this optimiser has 4"):
        optimiser.load_state_dict(other)
