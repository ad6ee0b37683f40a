"""Detectors: small incremental classes over numpy arrays (update / on_tick / snapshot)."""
