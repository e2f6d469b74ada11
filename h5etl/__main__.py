"""``python -m h5etl`` runs the command line."""

from h5etl.cli import main

main()
