"""The ``h5etl`` command line: nothing in the package imports it."""

from __future__ import annotations

import sys


def main() -> None:
    """The ``h5etl`` console script (``[project.scripts]``): run the command line."""
    from h5etl.cli import early, ending

    early.start(sys.argv[1:])  # a build's workers start while the command line loads
    from h5etl.cli.app import main as run

    try:
        run()
    except SystemExit as done:
        ending.exit_now(done.code)  # a command that succeeded ends without the teardown
        raise
    ending.exit_now(0)
