"""``h5etl check``: a read-only health report of a release."""
