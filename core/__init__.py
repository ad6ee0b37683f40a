"""failslow: find fail-slows (stragglers) and hangs in hybrid-parallel training jobs."""

__version__ = "0.1.0"
