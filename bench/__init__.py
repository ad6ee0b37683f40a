"""Benchmarks and accuracy suites (``failslow bench NAME``); product code never imports them."""
