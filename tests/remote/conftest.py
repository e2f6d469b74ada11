"""The S3 server fixtures of tests/remote (defined in ``s3_server``, which the tests import
their helpers from: mypy checks that module; two modules named conftest it cannot)."""

from s3_server import s3, s3_auth, s3_server, s3_versioned

__all__ = ["s3", "s3_auth", "s3_server", "s3_versioned"]
