"""The peers on the same server: MosaicML streaming (MDS shards) and LitData (its chunks)
reading the same samples as ``remote_read.py`` from a local S3-compatible server.

Run with a Python that has the peers, e.g. a venv beside the project's (never under pytest;
it asserts nothing about time)::

    python -m venv /tmp/peers --system-site-packages
    /tmp/peers/bin/pip install mosaicml-streaming litdata
    PYTHONPATH=. /tmp/peers/bin/python tests/benchmarks/remote_peers.py --samples 3000

Each peer writes the corpus's first ``--samples`` pairs (decoded to the release's uint8
arrays: image (3, 224, 224), mask (1, 224, 224), zero-padded as h5etl pads) into its own
shards with zstd, as its docs recommend, uploads them to a fresh bucket of s3rver (npm) and
reads them back through its own streaming dataset with a cache directory: the time to the
first sample, the median of ``--probes`` random samples, and one sequential epoch (a fresh
cache: every shard downloaded once). Printed as the same markdown table as remote_read.py.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).parent))
from corpus import CorpusParams, ensure_corpus
from remote_read import pattern, server

SHAPES = {"image": (3, 224, 224), "mask": (1, 224, 224)}


def samples(root: Path, count: int) -> Iterator[dict[str, np.ndarray]]:
    """The pairs decoded and padded to the release's shapes (top-left, fill 0)."""
    names = sorted((root / "images").glob(pattern(count)))
    for name in names:
        image = np.asarray(Image.open(name).convert("RGB")).transpose(2, 0, 1)
        mask = (np.asarray(Image.open(root / "masks" / name.name).convert("L")) > 0)[None]
        out = {}
        for key, array in (("image", image), ("mask", mask.astype(np.uint8))):
            padded = np.zeros(SHAPES[key], np.uint8)
            padded[:, : array.shape[1], : array.shape[2]] = array
            out[key] = padded
        yield out


def upload(folder: Path, bucket: str, prefix: str) -> None:
    import boto3

    client = boto3.client("s3")
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            client.upload_file(str(path), bucket, f"{prefix}/{path.relative_to(folder)}")


def timed(dataset: Any, probes: int, epoch: Callable[[], int]) -> dict[str, float]:
    rng = np.random.default_rng(1)
    rows = rng.integers(0, len(dataset), size=probes + 1)
    started = time.perf_counter()
    dataset[int(rows[0])]
    first = time.perf_counter() - started
    times = []
    for row in rows[1:]:
        started = time.perf_counter()
        dataset[int(row)]
        times.append(time.perf_counter() - started)
    started = time.perf_counter()
    count = epoch()
    return {
        "first_ms": first * 1e3,
        "random_ms": statistics.median(times) * 1e3,
        "mean_ms": statistics.fmean(times) * 1e3,
        "samples_s": count / (time.perf_counter() - started),
    }


def mosaic(root: Path, count: int, bucket: str, work: Path, probes: int) -> dict[str, float]:
    from streaming import MDSWriter, StreamingDataset  # type: ignore[import-not-found]

    shards = work / "mds"
    columns = {"image": "ndarray:uint8", "mask": "ndarray:uint8"}
    with MDSWriter(out=str(shards), columns=columns, compression="zstd") as writer:
        for sample in samples(root, count):
            writer.write(sample)
    upload(shards, bucket, "mds")
    os.environ["S3_ENDPOINT_URL"] = os.environ["AWS_ENDPOINT_URL"]

    def dataset(cache: str) -> Any:
        return StreamingDataset(
            remote=f"s3://{bucket}/mds", local=str(work / cache), shuffle=False, batch_size=1
        )

    random = dataset("mds-cache-random")

    def epoch() -> int:
        return sum(1 for _ in dataset("mds-cache-epoch"))

    return timed(random, probes, epoch)


def lit(root: Path, count: int, bucket: str, work: Path, probes: int) -> dict[str, float]:
    from litdata import StreamingDataset, optimize  # type: ignore[import-not-found]

    shards = work / "lit"
    optimize(
        fn=_identity,
        inputs=list(samples(root, count)),
        output_dir=str(shards),
        chunk_bytes="64MB",
        compression="zstd",
        num_workers=1,
    )
    upload(shards, bucket, "lit")
    options = {"endpoint_url": os.environ["AWS_ENDPOINT_URL"]}
    # its obstore (Rust) client refuses a plain-http endpoint unless told
    from litdata.streaming import downloader  # type: ignore[import-not-found]

    downloader._OBSTORE_CLIENT_OPTIONS = {**downloader._OBSTORE_CLIENT_OPTIONS, "allow_http": True}

    def dataset(cache: str) -> Any:
        return StreamingDataset(
            f"s3://{bucket}/lit", cache_dir=str(work / cache), storage_options=options
        )

    random = dataset("lit-cache-random")

    def epoch() -> int:
        return sum(1 for _ in dataset("lit-cache-epoch"))

    return timed(random, probes, epoch)


def _identity(sample: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return sample


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", default="s3rver", help="moto, s3rver or an endpoint URL")
    parser.add_argument("--samples", type=int, default=512)
    parser.add_argument("--probes", type=int, default=50)
    parser.add_argument("--base", type=Path, default=Path("/tmp/h5etl-bench"))
    parser.add_argument("--peers", nargs="*", default=["mosaicml-streaming", "litdata"])
    args = parser.parse_args(argv)
    corpus = ensure_corpus(args.base, CorpusParams(samples=3000))
    work = Path(tempfile.mkdtemp(prefix="h5etl-remote-peers-"))
    rows = {}
    try:
        with server(args.server, work / "server"):
            import boto3

            bucket = f"peers-{uuid.uuid4().hex[:8]}"
            boto3.client("s3").create_bucket(Bucket=bucket)
            for peer in args.peers:
                run = mosaic if peer == "mosaicml-streaming" else lit
                try:
                    rows[peer] = run(corpus.root, args.samples, bucket, work, args.probes)
                except Exception as exc:  # a peer that fails is reported, not fatal
                    print(f"{peer}: {type(exc).__name__}: {exc}", file=sys.stderr)
        print(f"\n{args.samples} pairs; {args.probes} random probes; server {args.server}\n")
        print(
            "| reader | first sample ms | random sample ms median (mean) | sequential samples/s |"
        )
        print("|---|---:|---:|---:|")
        for label, r in rows.items():
            print(
                f"| {label}, {args.server} | {r['first_ms']:.1f} | "
                f"{r['random_ms']:.2f} ({r['mean_ms']:.1f}) | "
                f"{r['samples_s']:.0f} |"
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
