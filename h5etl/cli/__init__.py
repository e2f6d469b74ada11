"""The ``h5etl`` command line: nothing in the package imports it."""

from __future__ import annotations

import sys


def main() -> None:
    """The ``h5etl`` console script (``[project.scripts]``): run the command line."""
    from h5etl.cli import early

    early.start(sys.argv[1:])  # a build's workers start while the command line loads
    from h5etl.cli.app import main as run

    run()
