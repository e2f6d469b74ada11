"""``python -m h5etl`` runs the command line."""

from h5etl.cli.app import main

main()
