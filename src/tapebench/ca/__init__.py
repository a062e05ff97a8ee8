"""Elementary cellular-automaton kernels.

`reference` is the specification (docs/protocol.md#environment); `packed` (numba, one uint64 word per tape) and
`torch_kernel` (batched tensors) must agree with it bit-exactly, which the property tests check.
Convention: cell i's neighbourhood is (x[i-1], x[i], x[i+1]) with wrap-around,
idx = 4*x[i-1] + 2*x[i] + x[i+1], and x'[i] = (rule >> idx) & 1.

Rule families (k colours, radius r; docs/protocol.md#rule-families): `reference` takes `family=`;
`table_kernel` (numba, uint8 cells) and `torch_table_kernel` (batched, per-row tables) work from rule
tables `RuleFamily.tables(rules)` and are tested bit-exact against the reference.
"""
from tapebench.ca.reference import ca_step, flip, transition

__all__ = ["ca_step", "flip", "transition"]
