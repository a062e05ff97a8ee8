"""A sampled k = 3, r = 1 rule set through splits, episodes, the MPC oracle and config (docs/protocol.md#rule-sets)."""
import copy

import numpy as np
import pytest
import torch
from pipeline_helpers import REPO

from tapebench.ca.reference import transition
from tapebench.episodes.sets import episode_set
from tapebench.episodes.streams import candidate_actions, episode_keys, step_key
from tapebench.evaluation.evaluate import evaluate_untrained, side_protocols
from tapebench.methods.contract import EpisodeBatch
from tapebench.methods.mpc import MPCConfig, MPCPolicy
from tapebench.pipeline.config import ConfigError, load_config, validate_config
from tapebench.rule_family import RuleFamily
from tapebench.rules.features import FeatureProtocol, write_features
from tapebench.rules.sampling import SampleSpec, sample_rule_set
from tapebench.splits.generate import SplitParams, generate_split
from tapebench.splits.health import SplitHealthError, split_health
from tapebench.splits.io import load_split, save_split
from tapebench.training.loop import TrainSpec

K3R1 = RuleFamily(3, 1)
SCHEMA = REPO / "workflow" / "schemas" / "config.schema.yaml"


@pytest.fixture(scope="module")
def k3r1_split(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("k3r1")
    sample = SampleSpec(n=10, lambda_bins=5, seed=2)
    rules = sample_rule_set(K3R1, sample)["rules"]
    write_features(tmp / "features.parquet", FeatureProtocol(L=8, trials=4, steps=8), rules, K3R1,
                   rule_set=sample.as_dict())
    params = SplitParams(name="fam", test_size=5, rules=tuple(rules), family=K3R1, rule_set=sample.as_dict())
    generate_split(params, tmp / "features.parquet", tmp / "fam.json")
    return tmp / "fam.json", rules


def test_family_split_is_mirror_safe_and_records_the_family(k3r1_split):
    path, rules = k3r1_split
    split = load_split(path)
    assert split.family == K3R1
    assert __import__("json").loads(path.read_text())["rule_set"] == {"n": 10, "lambda_bins": 5, "subfamily": "all",
                                                                      "seed": 2}
    assert sorted(split.train + split.test) == rules
    assert not {K3R1.mirror_rule(r) for r in split.test} & set(split.train)
    report = split_health(path)
    assert report["ok"] and report["family"] == {"k": 3, "r": 1} and report["mirror_leaks"] == 0


def test_family_split_health_names_a_mirror_leak(k3r1_split, tmp_path):
    path, _ = k3r1_split
    raw = __import__("json").loads(path.read_text())
    pair = next(r for r in raw["test"] if K3R1.mirror_rule(r) != r)
    partner = K3R1.mirror_rule(pair)
    raw["test"] = sorted(set(raw["test"]) - {partner})
    raw["train"] = sorted(raw["train"] + [partner])
    save_split(tmp_path / "leak.json", raw)
    with pytest.raises(SplitHealthError, match=f"{min(pair, partner)}|{max(pair, partner)}"):
        split_health(tmp_path / "leak.json")


def test_family_episodes_are_common_random_numbers_over_k_colours(k3r1_split):
    path, _ = k3r1_split
    sides = side_protocols(L=10, H=10, episodes_per_rule=3, eval_seed=0, split=load_split(path))
    again = side_protocols(L=10, H=10, episodes_per_rule=3, eval_seed=0, split=load_split(path))
    for (a, _, _), (b, _, _) in zip(sides, again):
        np.testing.assert_array_equal(a.tapes, b.tapes)
        assert a.family == K3R1 and a.rules.dtype == np.int64
    tapes = np.concatenate([episodes.tapes for episodes, _, _ in sides])
    assert set(np.unique(tapes)) == {0, 1, 2}
    # the elementary stream is untouched: colours=2 is the default
    eca = episode_set([30], 2, 10)
    assert set(np.unique(eca.tapes)) <= {0, 1} and eca.family.elementary


def test_family_mpc_decision_is_the_reference_random_shooting_decision():
    rules = sample_rule_set(K3R1, SampleSpec(n=3, lambda_bins=3, seed=4))["rules"][:3]
    episodes = episode_set(rules, 1, 9, family=K3R1)
    config = MPCConfig(horizon=4, candidates=16, seed=1)
    policy = MPCPolicy(config)
    policy.begin(EpisodeBatch(L=9, H=6, keys=episodes.keys, goal=np.zeros(9, np.uint8), success_bonus=1.0,
                              device=torch.device("cpu"), rules=episodes.rules, family=K3R1))
    obs = torch.cat([torch.as_tensor(episodes.tapes, dtype=torch.float32), torch.zeros(3, 1)], dim=1)
    got = policy.act(obs).numpy()
    for i, (tape, rule) in enumerate(zip(episodes.tapes, episodes.rules.tolist())):
        key = np.uint64(step_key(episode_keys(episodes.keys, config.seed)[i], 0))   # uint64, as inside the kernel
        plans = candidate_actions(key, config.candidates, config.horizon, 9)
        scores = []
        for plan in plans:
            s, score = tape, 0.0
            for a in plan:
                s = transition(s, int(a), rule, K3R1)
                if not s.any():
                    score += 9.0
                    break
                score -= np.count_nonzero(s)
            scores.append(score)
        assert got[i] == plans[int(np.argmax(scores)), 0]        # argmax: ties to the lowest candidate


def test_elementary_only_methods_fail_early_naming_the_family(k3r1_split):
    path, _ = k3r1_split
    sides = side_protocols(L=8, H=4, episodes_per_rule=1, eval_seed=0, split=load_split(path))
    with pytest.raises(ValueError, match="'bayes_filter' supports only the elementary family, not k = 3"):
        evaluate_untrained("bayes_filter", {}, 0, sides, train_rules=load_split(path).train)
    with pytest.raises(ValueError, match="'rad_dqn' supports only the elementary family"):
        TrainSpec(agent="rad_dqn", rules=(0,), seed=0, family={"k": 3, "r": 1})
    records, _ = evaluate_untrained("random", {}, 0, sides, train_rules=load_split(path).train)
    assert set(records["rule"]) == set(load_split(path).train + load_split(path).test)


def test_elementary_train_fingerprint_is_unchanged_by_the_family_field():
    spec = TrainSpec(agent="dqn", rules=(30, 110), seed=0)
    family_spec = TrainSpec(agent="dqn", rules=(30, 110), seed=0, family={"k": 3, "r": 1})
    assert spec.fingerprint() != family_spec.fingerprint()
    import dataclasses
    body = spec.fields()   # with the all-zero goal: the spec's fields less the goal's
    del body["family"]
    from tapebench.methods.equivariant import NETWORK_FIELDS  # an MLP run's fingerprint leaves them out too
    from tapebench.utils.io import content_hash
    body["hyperparameters"] = {k: v for k, v in dataclasses.asdict(spec.config()).items() if k not in NETWORK_FIELDS}
    assert spec.fingerprint() == content_hash(body)


def _config(*files):
    return load_config([REPO / f for f in files], root=REPO)


def test_family_presets_validate_and_default_configs_keep_their_splits():
    tiny = validate_config(_config("tests/data/tiny.yaml", "tests/data/family_k3r1_tiny.yaml"), SCHEMA)
    assert tiny["splits"]["main"]["rules"] == "sampled"
    validate_config(_config("config/family_k3r1.yaml"), SCHEMA)
    default = validate_config(_config(), SCHEMA)
    assert default["splits"]["main"]["rules"] == "0-255" and "sample" not in default["rule_set"]


@pytest.mark.parametrize("edit,message", [
    (lambda c: c["rule_set"].pop("sample"), "rule_set.sample"),
    (lambda c: c["rule_set"].update(family={"k": 4, "r": 1}), "beyond 64 bits"),
    (lambda c: c["splits"]["main"].update(rules="0-255"), "splits.main.rules"),
    (lambda c: c.update(methods=["dqn", "bayes_filter"]), "methods\\[1\\].*'bayes_filter' supports only the elementary"),
    (lambda c: c["splits"]["main"].update(test_size=40), "splits.main.test_size"),
    (lambda c: c["rule_set"]["sample"].update(n=5000, lambda_bins=1, subfamily="totalistic"), "rule_set.sample.*2187 mirror classes"),
])
def test_family_config_errors_name_the_key(edit, message):
    config = copy.deepcopy(_config("tests/data/tiny.yaml", "tests/data/family_k3r1_tiny.yaml"))
    edit(config)
    with pytest.raises(ConfigError, match=message):
        validate_config(config, SCHEMA)
