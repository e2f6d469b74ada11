"""``h5etl preview``: contact sheets of a release."""
