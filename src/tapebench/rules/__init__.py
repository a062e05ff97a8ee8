"""Rule space: mirror equivalence, rollout features and operational types
(docs/protocol.md#rule-types, #mirror-classes)."""
