"""Rule space: mirror equivalence, rollout features and operational types (SPEC §2, §3)."""
