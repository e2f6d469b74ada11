"""The cloud extra is optional: h5etl.remote imports without fsspec, and a URL without it (or
without the protocol's backend) is refused in one line naming ``pip install 'h5etl[cloud]'``."""

from __future__ import annotations

import subprocess
import sys

import pytest

BLOCKED = """
import sys
for name in sys.argv[1].split(","):
    sys.modules[name] = None  # import name now raises ImportError
import h5etl.remote.catalog, h5etl.remote.publish
from h5etl.remote import list_objects, parse_location
from h5etl.remote.errors import RemoteUsageError
assert not {"fsspec", "s3fs", "botocore"} & set(sys.modules) - set(sys.argv[1].split(","))
try:
    list_objects(parse_location("s3://bucket/raw"))
except RemoteUsageError as exc:
    print(exc.exit_code, exc)
"""


@pytest.mark.parametrize("blocked", ["fsspec", "s3fs", "fsspec,s3fs"])
def test_a_url_without_the_cloud_extra_is_one_line_naming_it(blocked: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", BLOCKED, blocked],
        capture_output=True,
        text=True,
        check=True,
    )
    lines = done.stdout.splitlines()
    assert len(lines) == 1, done.stdout + done.stderr
    assert lines[0].startswith("2 s3://bucket/raw: reading s3:// needs ")
    assert lines[0].endswith("pip install 'h5etl[cloud]'")
