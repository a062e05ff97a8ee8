"""The benchmark health report per split (docs/protocol.md#benchmark-health) and the gate that stops
the pipeline before training on a split that fails a fatal check."""
