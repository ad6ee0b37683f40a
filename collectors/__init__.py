"""Collectors and trace importers: producers of the event contract."""
