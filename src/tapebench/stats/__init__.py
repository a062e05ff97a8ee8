"""Statistics over seeds: bootstrap CIs, paired drop, method tests, and the aggregation stages."""
