"""The evaluation contract: common-random-number episodes, policy rollouts, per-episode records."""
