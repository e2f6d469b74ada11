"""Incremental builds: what a new release reuses of its parent."""
