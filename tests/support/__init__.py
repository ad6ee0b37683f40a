"""Shared test helpers: job and event generators (fixtures are in tests/conftest.py)."""
