"""Sharded builds: K shard writers in parallel, one committer."""
