"""Reference controllers with the true rule, and calibration (docs/protocol.md#metrics, #oracle;
paper Table 1, 6, 7, App. F, I).

- `mpc`: true-dynamics random-shooting MPC, the budgeted planning reference (p_oracle).
- `exact`: exact finite-horizon DP over all 2^L tapes (L <= 20): the optimal controller.
- `feasibility`: per-rule exact reachability of the goal within H steps.
- `gap`: MPC vs the exact optimum on the same episodes; `by_type`: mpc_by_type_eval.json.
- `normalized`: ON(p) = 100 p / p_oracle under a matched protocol; `tables`: Tables 1 and 7.
Every oracle plays the common-random-number evaluation episodes the learned agents play.
"""
