"""The test's own hand on the S3 server, beside the code under test: make buckets, and
write objects the way a broken or hostile publisher would (short, wrong bytes)."""

from __future__ import annotations

import time

from bundle.sources.credentials import SourceCredentials
from bundle.sources.ranged import RetryPolicy
from bundle.sources.s3 import S3Location, make_client

from servers import S3_ACCESS_KEY, S3_SECRET_KEY

CREDENTIALS = SourceCredentials({"AWS_ACCESS_KEY_ID": S3_ACCESS_KEY,
                                 "AWS_SECRET_ACCESS_KEY": S3_SECRET_KEY})


def admin_client(endpoint: str):
    return make_client(S3Location.parse(f"s3://admin-bucket?endpoint={endpoint}"), CREDENTIALS,
                       RetryPolicy(attempts=1, connect_timeout_seconds=2, read_timeout_seconds=10))


def make_bucket(client, bucket: str, timeout: float = 30.0) -> None:
    """Create ``bucket``; a server that just started may need its filer first, so retry."""
    from botocore.exceptions import ClientError, HTTPClientError
    deadline = time.monotonic() + timeout
    while True:
        try:
            client.create_bucket(Bucket=bucket)
            return
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                return
            if time.monotonic() > deadline:
                raise
        except HTTPClientError:
            if time.monotonic() > deadline:
                raise
        time.sleep(0.2)
