"""Tables 2, 3, 4 rendered from a hand-made aggregate table with known numbers."""
import re

import pandas as pd
import pytest

from tapebench.report.tables import display_name, render_result_table, table3_context
from tapebench.utils.io import write_parquet

# (agent, H, side, metric) -> (mean, ci_low, ci_high); the paper's DQN / PPO rows of Table 3
NUMBERS = {
    ("dqn", 32, "train", "success"): (0.073, 0.072, 0.075),
    ("dqn", 32, "test", "success"): (0.048, 0.046, 0.050),
    ("dqn", 32, "drop", "success"): (0.0258, 0.024, 0.027),
    ("dqn", 32, "test", "return"): (-28.914, -29.1, -28.7),
    ("ppo", 32, "train", "success"): (0.070, 0.068, 0.072),
    ("ppo", 32, "test", "success"): (0.042, 0.040, 0.044),
    ("ppo", 32, "drop", "success"): (0.028, 0.026, 0.030),
    ("ppo", 32, "test", "return"): (-29.5, -29.61, -29.38),
    ("my_agent", 32, "train", "success"): (0.5, 0.4, 0.6),
    ("my_agent", 32, "test", "success"): (0.25, 0.2, 0.3),
    ("my_agent", 32, "drop", "success"): (0.25, 0.2, 0.3),
    ("dqn", 32, "test", "on_success"): (25.67, 20.1, 31.2),
    ("random", 32, "train", "success"): (0.011, 0.010, 0.012),
    ("random", 32, "test", "success"): (0.020, 0.019, 0.021),
    ("random", 32, "drop", "success"): (-0.009, -0.010, -0.008),
    ("random", 32, "test", "on_success"): (10.7, 9.0, 12.5),
    ("mpc", 32, "train", "success"): (0.312, 0.31, 0.314),
    ("mpc", 32, "test", "success"): (0.187, 0.18, 0.19),
    ("mpc", 32, "drop", "success"): (0.125, 0.12, 0.13),
    ("dqn", 32, "test", "agnostic_score"): (-40.5, -55.0, -30.25),
    ("mpc", 32, "train", "rule_headroom"): (0.301, 0.29, 0.31),
    ("mpc", 32, "test", "rule_headroom"): (0.167, 0.15, 0.18),
}
FINAL_DIST = {("dqn", "train"): 0.927, ("dqn", "test"): 0.952, ("ppo", "train"): 0.930, ("ppo", "test"): 0.958,
              ("my_agent", "train"): 0.5, ("my_agent", "test"): 0.7, ("random", "train"): 0.96,
              ("random", "test"): 0.97, ("mpc", "train"): 0.3, ("mpc", "test"): 0.4}


def aggregate_table() -> pd.DataFrame:
    rows = []
    for (agent, H, side, metric), (mean, low, high) in NUMBERS.items():
        rows.append((agent, H, side, metric, mean, low, high))
    for (agent, side), d in FINAL_DIST.items():
        for H, shift in ((32, 0.0), (64, 0.003)):
            rows.append((agent, H, side, "final_dist", d + shift, d - 0.01, d + 0.01))
            rows.append((agent, H, side, "auc_dist", d + 0.007, d, d + 0.01))
            rows.append((agent, H, side, "soft_success@0.1", 1 - d - shift, 0.0, 1.0))
        if agent in ("dqn", "ppo"):  # the others have no H = 64 success: their cells are missing
            succ = NUMBERS[(agent, 32, side, "success")][0]
            rows.append((agent, 64, side, "success", succ - 0.003, succ - 0.005, succ))
    df = pd.DataFrame(rows, columns=["agent", "H", "side", "metric", "mean", "ci_low", "ci_high"])
    return df.assign(split="main", L=32, n=20, sd=0.01, ci=0.95, n_resamples=2000)


def body_rows(text: str) -> list[str]:
    body = text.split("\\midrule", 1)[1].split("\\bottomrule")[0]
    return [line for line in body.strip().splitlines() if line.strip().endswith("\\\\") and "multicolumn" not in line]


def assert_well_formed(text: str, n_columns: int) -> None:
    assert text.count("{") == text.count("}")
    for env in ("table", "tabular"):
        assert text.count(f"\\begin{{{env}}}") == text.count(f"\\end{{{env}}}") == 1
    spec = re.search(r"\\begin\{tabular\}\{([^}]*)\}", text).group(1)
    assert len(spec) == n_columns
    for line in body_rows(text):
        assert len(re.findall(r"(?<!\\)&", line)) == n_columns - 1, line


@pytest.fixture()
def aggregate_path(tmp_path):
    path = tmp_path / "aggregate.parquet"
    write_parquet(path, aggregate_table(), meta={"last_k": 3, "config": {"n_resamples": 2000, "ci": 0.95}})
    return path


def test_table3_rows_ci_lines_on_column_and_reference_rows(aggregate_path, tmp_path):
    text = render_result_table("table3", aggregate_path, tmp_path / "t3.tex", split="main", H=32)
    assert "DQN & 20 & 0.073 & 0.048 & 0.026 & -28.91 & 25.7 & -40.5 \\\\" in text
    assert (" & & [0.072, 0.075] & [0.046, 0.050] & [0.024, 0.027] & [-29.10, -28.70] & [20.1, 31.2] "
            "& [-55.0, -30.2] \\\\") in text
    assert "PPO & 20 & 0.070 & 0.042 & 0.028 & -29.50 & -- & -- \\\\" in text
    assert " & & [0.068, 0.072] & [0.040, 0.044] & [0.026, 0.030] & [-29.61, -29.38] & -- & -- \\\\" in text
    # unregistered ids keep their name, LaTeX-escaped, in "Other"; a missing cell is '--'
    assert "my\\_agent & 20 & 0.500 & 0.250 & 0.250 & -- & -- & -- \\\\" in text
    # the MPC is the ON(p) reference and the score's 100: by definition
    assert "True-dynamics MPC & 20 & 0.312 & 0.187 & 0.125 & -- & 100 & 100 \\\\" in text
    assert "Random policy & 20 & 0.011 & 0.020 & -0.009 & -- & 10.7 & -- \\\\" in text
    # the rule-dependent headroom, ID and OOD, in the caption
    assert "Rule-dependent headroom" in text and "ID 0.301 [0.290, 0.310], OOD 0.167 [0.150, 0.180]" in text
    assert "over 20 seeds" in text and "95\\% CIs" in text and "2000 resamples" in text
    assert "last 3 evaluation checkpoints" in text and "\\texttt{main}" in text and "$H=32$" in text
    assert "relative to the True-dynamics MPC" in text
    # grouped by family in registry order; references last, under a rule with a label
    names = [row.split(" & ")[0] for row in body_rows(text) if not row.startswith(" &")]
    assert names == ["DQN", "PPO", "my\\_agent", "Random policy", "True-dynamics MPC"]
    assert text.index("Reference (not learned)") < text.index("Random policy &")
    assert text.count("\\midrule") == 4
    assert_well_formed(text, 8)
    assert (tmp_path / "t3.tex").read_text() == text


def test_table3_hides_the_score_where_the_headroom_is_too_narrow(aggregate_path, tmp_path):
    # the OOD headroom is 0.167: a threshold above it empties the Score column and says why; one below keeps it
    text = render_result_table("table3", aggregate_path, tmp_path / "t3.tex", split="main", H=32, min_headroom=0.2)
    assert "DQN & 20 & 0.073 & 0.048 & 0.026 & -28.91 & 25.7 & -- \\" in text
    assert "True-dynamics MPC & 20 & 0.312 & 0.187 & 0.125 & -- & 100 & -- \\" in text
    assert "is not shown: the OOD headroom is below 0.20 (\\texttt{health.rule\\_headroom.warn})" in text  # escaped
    assert_well_formed(text, 8)
    text = render_result_table("table3", aggregate_path, tmp_path / "t3.tex", split="main", H=32, min_headroom=0.1)
    assert "DQN & 20 & 0.073 & 0.048 & 0.026 & -28.91 & 25.7 & -40.5 \\" in text and "not shown" not in text


def test_table3_caption_states_the_floor(aggregate_path, tmp_path):
    from tapebench.splits.io import save_split

    split = tmp_path / "s.json"
    save_split(split, {"name": "main", "train": [4, 12, 200], "test": [0, 30, 76],
                       "types": {}, "params": {"method": "hand"}, "unit": "rule"})
    per_rule = pd.DataFrame({"split": "main", "agent": "random", "L": 32, "H": 32, "seed": [0, 0, 0, 1, 1, 1],
                             "side": "test", "rule": [0, 30, 76] * 2, "type": "", "metric": "success",
                             "value": [1.0, 0.1, 0.95, 1.0, 0.0, 0.9], "k_used": 1, "n_episodes": 20})
    per_rule_path = tmp_path / "random.per_rule.parquet"
    write_parquet(per_rule_path, per_rule)
    text = render_result_table("table3", aggregate_path, tmp_path / "t3.tex", split="main", H=32,
                               split_file=split, random_per_rule=per_rule_path)
    assert ("Floor: 1 of the 3 test rules is solved by any action (every action reaches the goal in one step: "
            "rule 0); the random policy succeeds in at least 90\\% of episodes on 2 of them (rules 0, 76).") in text
    # multi-goal protocol: a constant rule's every reachable tape, hence its derived goal, is c...c (rule 255: ones)
    save_split(split, {"name": "main", "train": [4, 12, 200], "test": [0, 30, 255],
                       "types": {}, "params": {"method": "hand"}, "unit": "rule"})
    derived = render_result_table("table3", aggregate_path, tmp_path / "t3.tex", split="main", H=32,
                                  split_file=split, goal="derived")
    zeros = render_result_table("table3", aggregate_path, tmp_path / "t3.tex", split="main", H=32, split_file=split)
    assert "Floor: 2 of the 3 test rules are solved by any action (every action reaches the goal in one step: " \
           "rules 0, 255)." in derived
    assert "Floor: 1 of the 3 test rules is solved by any action (every action reaches the goal in one step: " \
           "rule 0)." in zeros
    with pytest.raises(ValueError, match="goal must be one of"):
        render_result_table("table3", aggregate_path, tmp_path / "t3.tex", split="main", H=32, split_file=split,
                            goal="ones")


def test_table3_agent_selection_and_order(aggregate_path, tmp_path):
    text = render_result_table("table3", aggregate_path, tmp_path / "t3.tex", split="main", H=32,
                               agents=["ppo", "dqn"])
    # --agents selects rows; rows stay grouped by family (value-based before actor-critic)
    assert text.index("DQN & 20") < text.index("PPO & 20") and "my\\_agent" not in text and "Random" not in text
    with pytest.raises(ValueError, match="not in the aggregate table"):
        render_result_table("table3", aggregate_path, tmp_path / "x.tex", split="main", H=32, agents=["sac"])


def test_table2_holdout_length_with_best_and_second(aggregate_path, tmp_path):
    text = render_result_table("table2", aggregate_path, tmp_path / "t2.tex", split="main")
    rows = {row.split(" & ")[0]: row for row in body_rows(text)}
    # columns: ID H32 succ/dist, ID H64 succ/dist, OOD H32 succ/dist, OOD H64 succ/dist
    # (my_agent is best where present; without it in the H = 64 success column, DQN is best there)
    assert rows["DQN"] == ("DQN & \\underline{0.073} & \\underline{0.927} & \\textbf{0.070} & \\underline{0.930} & "
                           "\\underline{0.048} & \\underline{0.952} & \\textbf{0.045} & \\underline{0.955} \\\\")
    assert rows["PPO"].split(" & ")[1:3] == ["0.070", "0.930"]
    assert rows["my\\_agent"].split(" & ")[1:3] == ["\\textbf{0.500}", "\\textbf{0.500}"]
    assert rows["my\\_agent"].split(" & ")[3] == "--"  # no H = 64 success for this agent
    # reference rows are never marked best: the MPC's 0.312 is higher but DQN's ID H=32 success is underlined
    assert "\\textbf" not in rows["True-dynamics MPC"] and "\\underline" not in rows["True-dynamics MPC"]
    assert "\\multicolumn{2}{c}{$H=64$}" in text and "\\cmidrule(lr){6-9}" in text
    assert_well_formed(text, 9)


def test_table2_marks_no_rule_agnostic_row_best(tmp_path):
    # the rule-agnostic rows do not learn: like the references, they are never ranked among the learned methods
    table = aggregate_table()
    live = table[table["agent"] == "dqn"].assign(agent="live_leftmost")
    live["mean"] = live["metric"].map({"success": 0.9}).fillna(0.01)
    write_parquet(tmp_path / "a.parquet", pd.concat([table, live]), meta={"last_k": 3})
    text = render_result_table("table2", tmp_path / "a.parquet", tmp_path / "t2.tex", split="main")
    rows = {row.split(" & ")[0]: row for row in body_rows(text)}
    assert rows["Flip lowest live cell"].split(" & ")[1:3] == ["0.900", "0.010"]
    assert "\\textbf" not in rows["Flip lowest live cell"] and "\\underline" not in rows["Flip lowest live cell"]
    assert rows["my\\_agent"].split(" & ")[1:3] == ["\\textbf{0.500}", "\\textbf{0.500}"]


def test_table4_groups_by_family(aggregate_path, tmp_path):
    text = render_result_table("table4", aggregate_path, tmp_path / "t4.tex", split="main", H=32)
    assert "DQN & 0.927 & 0.952 & 0.934 & 0.959 & 0.073 & 0.048 \\\\" in text
    assert "PPO & 0.930 & 0.958 & 0.937 & 0.965 & 0.070 & 0.042 \\\\" in text
    order = [text.index(s) for s in ("Value-based", "DQN &", "Actor--critic", "PPO &", "Other", "my\\_agent &",
                                     "Reference (not learned)", "Random policy &", "True-dynamics MPC &")]
    assert order == sorted(order)
    assert_well_formed(text, 7)


def test_bad_selection_is_named(aggregate_path, tmp_path):
    with pytest.raises(ValueError, match="split 'other' is not in the aggregate.*'main'"):
        render_result_table("table3", aggregate_path, tmp_path / "x.tex", split="other", H=32)
    with pytest.raises(ValueError, match=r"H = \[48\].*available: \[32, 64\]"):
        render_result_table("table3", aggregate_path, tmp_path / "x.tex", split="main", H=48)
    with pytest.raises(FileNotFoundError, match="aggregate file not found"):
        render_result_table("table3", tmp_path / "missing.parquet", tmp_path / "x.tex", split="main", H=32)
    assert not (tmp_path / "x.tex").exists()


def test_display_names_and_context():
    assert display_name("mpc") == "True-dynamics MPC" and display_name("new_agent") == "new_agent"
    context = table3_context(aggregate_table(), "main", 32)
    dqn = next(r for g in context["groups"] for r in g["rows"] if r["agent"] == "dqn")
    assert (dqn["drop"]["mean"], dqn["drop"]["low"], dqn["n"]) == (0.0258, 0.024, 20)
