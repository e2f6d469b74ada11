"""urls: whether an input path is a URL (an object on object storage) or a local path.

Apart from ``remote_files`` so the modules every local build runs (reading a file, stamping
it, cutting tasks) tell the two apart without importing ``h5etl.remote`` (about 10 ms a
process, paid in the parent and every worker): a local build never loads it.
"""

from __future__ import annotations

import re

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")

# What a worker imports to read objects (``remote_files``, botocore's credential chain,
# obstore's client): imported while the parent lists and plans, not in the first task
# (0.1 s of CPU a worker, most of it botocore); a library not installed is skipped.
REMOTE_READING = ("h5etl.inputs.remote_files", "botocore.session", "obstore")


def is_remote(path: str) -> bool:
    """Whether an input path is a URL: local ones are absolute paths (one character tested)."""
    return path[:1] != "/" and _URL.match(path) is not None and not path.startswith("file://")
