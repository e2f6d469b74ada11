"""Where decoding runs: the worker pool, threads, Dask, shared memory."""
