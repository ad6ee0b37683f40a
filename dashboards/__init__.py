"""Dashboards and reports: what a person looks at."""
