"""Helpers the Snakemake workflow calls: config validation and per-job config slices."""
