"""Option helpers shared by the commands."""

from __future__ import annotations

import argparse
import sys
from typing import Any


class DeprecatedOption(argparse.Action):
    """An old spelling of an option: still works, and says which one to use."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        new = "--" + self.dest.replace("_", "-")
        print(f"{parser.prog}: {option_string} is deprecated; use {new}", file=sys.stderr)
        setattr(namespace, self.dest, values)
