"""Fixtures shared by the test modules."""
from __future__ import annotations

import os

import pytest
import torch
from agent_contract import toy_split as write_toy_split
from filelock import FileLock
from pipeline_helpers import build_tiny

from tapebench.splits.io import load_split


@pytest.fixture
def toy_split(tmp_path):
    """The hand-made split of agent_contract.toy_split (train 4, 12, 200; test 0, 76), loaded."""
    return load_split(write_toy_split(tmp_path / "toy.json"))


@pytest.fixture(scope="module")
def one_torch_thread():
    """Small tensors: more threads only add contention on a shared machine (use with
    `pytestmark = pytest.mark.usefixtures("one_torch_thread")`)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture
def goal_blind_method(monkeypatch):
    """A registered method `goal_blind` that trains (DQN's parts) but does not take an episode's goal
    (goal_conditioned=False), as a plug-in may be: every built-in learned method takes it, so the multi-goal
    protocol's refusals are tested on this one."""
    import dataclasses

    from tapebench.registry import registry

    methods = registry()
    blind = dataclasses.replace(methods["dqn"], id="goal_blind", display_name="Goal-blind DQN", goal_conditioned=False)
    monkeypatch.setitem(methods, "goal_blind", blind)
    return blind


@pytest.fixture(scope="session")
def tiny_build(tmp_path_factory):
    """The tiny protocol's whole default DAG (tests/data/tiny.yaml), built once per test session and shared by
    the pipeline, figure, report and study tests. Read it; copy it (`pipeline_helpers.copy_workdir`) before
    changing anything. pytest-xdist workers share one build through a lock. Its users form two groups of about
    equal length, `xdist_group("tiny_build")` and `xdist_group("tiny_build_2")`: each group stays on one worker,
    and on a 2-core machine the two run side by side (the second waits for the build once), where one group would
    be the whole suite's critical path."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent
    with FileLock(str(root / "tiny_build.lock")):
        return build_tiny(root / "tiny_build")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    """Under `--dist loadgroup` a module's tests stay on one worker (its module-scoped fixtures, e.g. a trained
    agent or a pipeline build, are made once), unless the module names a group itself (`tiny_build`,
    `tiny_build_2`)."""
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))
