"""Remote read benchmark: one release read from a local S3-compatible server against the same
file on local disk, written with HDF5's default file space and with ``storage.page_size``.

Run on its own (never under pytest; it asserts nothing about time)::

    python tests/benchmarks/remote_read.py                       # moto's server, 512 samples
    python tests/benchmarks/remote_read.py --server s3rver --samples 3000
    python tests/benchmarks/remote_read.py --server http://127.0.0.1:9000   # a running server

It builds the benchmark corpus (``corpus.py``, cached in /tmp/h5etl-bench) twice with the
default codec (Blosc-LZ4, chunks of 32): as configured, and with ``storage.page_size`` (1 MiB
pages); publishes both to a fresh bucket (``h5etl.remote.publish``) and measures, each in a
fresh reader:

- ``open``: ``Release(url, "train")`` (the pointer GET, the metadata reads) and its requests;
- ``first sample``: the first ``read([i])`` after opening (the chunk index, one chunk);
- ``random``: the median of ``--probes`` single random samples (uniform over the split; each
  a first touch of its chunk while the 64 MiB of blocks and the decoded-chunk cache are cold);
- ``sequential``: samples/s over one epoch of ``iter_batches(shuffle=False)``;
- ``requests``: the range reads the whole run sent (``RemoteFile.requests``, summed).

``local`` is the same file opened from the build folder (page cache warm). The server's
times are those of a process on this machine: no network, but all of its own per-request
cost. moto is a Python server that re-reads a large object for every ranged GET (its time
grows with the object's size); s3rver (npm) streams ranges from files. Set ``--server URL``
for any other server; credentials then come from the environment.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import yaml

sys.path.insert(0, str(Path(__file__).parent))
from corpus import CorpusParams, ensure_corpus

import h5etl
from h5etl.readers import Release, iter_batches
from h5etl.remote import parse_location, publish
from h5etl.remote import reading as remote_reading

PAGE = 2**20
S3RVER = Path(os.environ.get("S3RVER_DIR", "/tmp/s3rver")) / "node_modules/s3rver/bin/s3rver.js"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_up(endpoint: str, process: subprocess.Popen[bytes]) -> None:
    for _ in range(300):
        if process.poll() is not None:
            raise SystemExit(f"the server exited ({process.returncode})")
        try:
            with urllib.request.urlopen(endpoint, timeout=1):
                return
        except urllib.error.HTTPError:
            return  # it answers (403 for an anonymous GET of /)
        except OSError:
            time.sleep(0.1)
    raise SystemExit("the server did not answer within 30 s")


@contextmanager
def server(kind: str, folder: Path) -> Iterator[None]:
    """A local S3 server process for the run, the environment pointed at it."""
    if kind.startswith("http"):
        os.environ["AWS_ENDPOINT_URL"] = kind
        yield
        return
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    if kind == "moto":
        command = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
        keys = ("bench", "bench")
    elif kind == "s3rver":
        command = ["node", str(S3RVER), "-a", "127.0.0.1", "-p", str(port), "-d", str(folder)]
        keys = ("S3RVER", "S3RVER")
    else:
        raise SystemExit(f"unknown server {kind!r}: moto, s3rver or a URL")
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_up(endpoint, process)
        os.environ.update(
            AWS_ENDPOINT_URL=endpoint,
            AWS_ACCESS_KEY_ID=keys[0],
            AWS_SECRET_ACCESS_KEY=keys[1],
            AWS_DEFAULT_REGION="us-east-1",
        )
        yield
    finally:
        process.terminate()
        process.wait(timeout=10)


def pattern(samples: int) -> str:
    """The glob of the corpus's first ``samples`` pairs (s000000.png...), in hundreds."""
    if samples >= 3000:
        return "*.png"
    if samples >= 1000:
        return f"s00[0-{samples // 1000 - 1}]*.png"
    return f"s000[0-{max(1, samples // 100) - 1}]*.png"


def build(corpus_config: Path, samples: int, work: Path, page_size: int | None) -> Path:
    """The corpus's blosc-lz4 release of its first ``samples`` pairs (paged or not)."""
    config = yaml.safe_load(corpus_config.read_text())
    root = corpus_config.parent
    name = "paged" if page_size else "default"
    for source in config["sources"].values():
        source["dir"] = str(root / source["dir"])
        # s000000.png...: the first `samples` pairs by a glob on their numbers
        source["glob"] = pattern(samples)
    config["output"] = str(work / name)
    config["name"] = name
    config["storage"]["page_size"] = page_size
    if page_size is None:
        del config["storage"]["page_size"]
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    report = h5etl.build(h5etl.load_spec(path), jobs=2)
    assert report.path is not None
    return report.path


def upload(path: Path, bucket: str, name: str, kind: str) -> None:
    """``path`` published as ``s3://bucket/name/name.h5``: by ``publish`` (conditional
    writes, a versioned listing), or for s3rver, which has neither, by a plain upload and
    the pointer written beside it (the same objects a reader finds)."""
    if kind != "s3rver":
        publish.publish(path, parse_location(f"s3://{bucket}/{name}"), name)
        return
    import boto3

    client = boto3.client("s3")
    key = f"{name}/{publish.release_filename(name, 1)}"
    client.upload_file(str(path), bucket, key)
    stored = client.head_object(Bucket=bucket, Key=key)
    pointer = publish.Pointer(
        name=name,
        version=1,
        file=publish.release_filename(name, 1),
        size=int(stored["ContentLength"]),
        sha256=hashlib.sha256(path.read_bytes()).hexdigest(),
        etag=str(stored["ETag"]).strip('"'),
        version_id=None,
        published="2026-12-04T00:00:00+00:00",
    )
    client.put_object(Bucket=bucket, Key=f"{name}/{name}.h5.json", Body=pointer.to_json())


def counted() -> list[Any]:
    """Every RemoteFile made from now on, to sum their requests."""
    made: list[Any] = []
    original = remote_reading.RemoteFile.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        made.append(self)

    remote_reading.RemoteFile.__init__ = init  # type: ignore[method-assign]
    return made


def measure(where: str, probes: int, seed: int, cache_dir: Path | None = None) -> dict[str, float]:
    Release(where, "train", cache_dir=cache_dir).close()  # imports, the S3 session: not timed
    made = counted()
    started = time.perf_counter()
    reader = Release(where, "train", batch_size=1, cache_dir=cache_dir)
    opened = time.perf_counter() - started
    open_requests = sum(f.requests for f in made)
    rng = np.random.default_rng(seed)
    rows = rng.integers(0, len(reader), size=probes + 1)
    started = time.perf_counter()
    reader.read([int(rows[0])])
    first = time.perf_counter() - started
    times = []
    for row in rows[1:]:
        started = time.perf_counter()
        reader.read([int(row)])
        times.append(time.perf_counter() - started)
    reader.close()
    epochs = []
    for _ in range(2):  # a fresh reader each: the best of two (the machine is shared)
        started = time.perf_counter()
        batches = iter_batches(where, "train", 32, shuffle=False, cache_dir=cache_dir)
        count = sum(len(b["image"]) for b in batches)
        epochs.append(count / (time.perf_counter() - started))
    return {
        "open_ms": opened * 1e3,
        "open_requests": open_requests,
        "first_ms": first * 1e3,
        "random_ms": statistics.median(times) * 1e3,
        "mean_ms": statistics.fmean(times) * 1e3,
        "samples_s": max(epochs),
        "requests": sum(f.requests for f in made),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", default="moto", help="moto, s3rver or an endpoint URL")
    parser.add_argument("--samples", type=int, default=512, help="corpus pairs (<= 3000)")
    parser.add_argument("--probes", type=int, default=50, help="random single-sample reads")
    parser.add_argument("--page-size", type=int, default=PAGE, help="storage.page_size")
    parser.add_argument("--base", type=Path, default=Path("/tmp/h5etl-bench"))
    args = parser.parse_args(argv)
    corpus = ensure_corpus(args.base, CorpusParams(samples=3000))
    work = Path(tempfile.mkdtemp(prefix="h5etl-remote-read-"))
    try:
        files = {
            "default": build(corpus.root / "blosc-lz4.yaml", args.samples, work, None),
            "paged": build(corpus.root / "blosc-lz4.yaml", args.samples, work, args.page_size),
        }
        rows: dict[str, dict[str, float]] = {}
        for name, path in files.items():
            rows[f"local disk, {name}"] = measure(str(path), args.probes, 1)
        with server(args.server, work / "server"):
            bucket = f"bench-{uuid.uuid4().hex[:8]}"
            import boto3

            boto3.client("s3").create_bucket(Bucket=bucket)
            for name, path in files.items():
                upload(path, bucket, name, args.server)
                url = f"s3://{bucket}/{name}/{name}.h5"
                rows[f"{args.server}, {name}"] = measure(url, args.probes, 1)
            cache = work / "cache"
            url = f"s3://{bucket}/default/default.h5"
            measure(url, args.probes, 2, cache)  # fills the disk cache
            rows[f"{args.server}, default, disk cache warm"] = measure(url, args.probes, 2, cache)
        sizes = {n: p.stat().st_size / 2**20 for n, p in files.items()}
        print(
            f"\n{args.samples} pairs; release {sizes['default']:.1f} MiB (paged "
            f"{sizes['paged']:.1f} MiB, pages of {args.page_size} B); {args.probes} random "
            f"probes; server {args.server}\n"
        )
        print(
            "| reader | open ms (range reads) | first sample ms | random sample ms median (mean) "
            "| sequential samples/s | range reads in all |"
        )
        print("|---|---:|---:|---:|---:|---:|")
        for label, r in rows.items():
            print(
                f"| {label} | {r['open_ms']:.1f} ({r['open_requests']:.0f}) | "
                f"{r['first_ms']:.1f} | {r['random_ms']:.2f} ({r['mean_ms']:.1f}) | "
                f"{r['samples_s']:.0f} | "
                f"{r['requests']:.0f} |"
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
