"""An incremental build into ``s3://`` needs its parent's bytes to carry chunks: download the
parent once, or range-read it? Both ways measured on a release (by default the 3,000-pair
corpus's lzf release, ``corpus.py``) published to a local S3 server (moto, started here):

    upload     publish(): the multipart upload, verified, and the pointer
    download   RemoteOutputFolder.current_release(): the whole file, sha256-checked, to disk;
               then every chunk read from the local copy (what carrying reads)
    range      h5py over RemoteFile (4 MiB blocks, 16 kept; and the readers' 1 MiB, 64 kept):
               every chunk read by range reads

    python tests/benchmarks/remote_parent.py --release /path/to/bench-v0001.h5 [--repeats 3]

Carrying reads nearly every chunk of the parent (the unchanged samples' chunks), so both ways
move about the whole file; the figures say what the round trips and the block cache cost.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import h5py

from h5etl.release.remote_folder import RemoteOutputFolder
from h5etl.remote import parse_location, stat_object
from h5etl.remote.publish import publish
from h5etl.remote.reading import RemoteFile


def walk_chunks(handle: h5py.File) -> int:
    """Read every chunk (raw, as carrying does) of every dataset; the bytes read."""
    total = 0

    def visit(_: str, node: object) -> None:
        nonlocal total
        if not isinstance(node, h5py.Dataset):
            return
        if node.chunks is None:
            total += node[()].nbytes if node.shape else 0
            return
        for index in range(node.id.get_num_chunks()):
            info = node.id.get_chunk_info(index)
            total += len(node.id.read_direct_chunk(info.chunk_offset)[1])

    handle.visititems(visit)
    return total


def start_server(log: Path) -> tuple[subprocess.Popen[bytes], str]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    endpoint = f"http://127.0.0.1:{port}"
    with log.open("wb") as out:
        server = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    for _ in range(300):
        try:
            with urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1):
                return server, endpoint
        except OSError:
            time.sleep(0.1)
    server.kill()
    raise SystemExit("the moto server did not start")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--release", type=Path, required=True)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="h5etl-remote-parent-"))
    server, endpoint = start_server(work / "moto.log")
    os.environ.update(
        AWS_ACCESS_KEY_ID="bench",
        AWS_SECRET_ACCESS_KEY="bench",
        AWS_ENDPOINT_URL=endpoint,
        AWS_DEFAULT_REGION="us-east-1",
    )
    try:
        import boto3

        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="bench")
        output = parse_location("s3://bench/releases")
        size = args.release.stat().st_size
        began = time.perf_counter()
        pointer = publish(args.release, output, "bench")
        print(f"release: {args.release} ({size / 2**20:.1f} MiB)")
        print(f"upload (multipart, verified) + pointer: {time.perf_counter() - began:.2f} s")
        shapes = {"range 4M x16": (4 * 2**20, 16), "range 1M x64": (2**20, 64)}
        rows: dict[str, list[float]] = {"download": [], "download+walk": []}
        rows.update({name: [] for name in shapes})
        moved: dict[str, tuple[int, int]] = {}
        for repeat in range(args.repeats):
            folder = RemoteOutputFolder(output, "bench", work=work / f"w{repeat}")
            began = time.perf_counter()
            found = folder.current_release()
            rows["download"].append(time.perf_counter() - began)
            assert found is not None
            with h5py.File(found[1], "r") as handle:
                walk_chunks(handle)
            rows["download+walk"].append(time.perf_counter() - began)
            obj = stat_object(output.child(pointer.file))
            for name, (block, kept) in shapes.items():
                began = time.perf_counter()
                remote = RemoteFile(obj, block_size=block, max_blocks=kept)
                with h5py.File(remote, "r") as handle:
                    walk_chunks(handle)
                rows[name].append(time.perf_counter() - began)
                moved[name] = (remote.requests, remote.requests * block)
        for name, times in rows.items():
            each = ", ".join(f"{t:.2f}" for t in times)
            print(f"{name:<14} median {statistics.median(times):6.2f} s  ({each})")
        print(f"download: {size:,} bytes in {-(-size // (64 * 2**20))} range reads of <= 64 MiB")
        for name, (requests, most) in moved.items():
            print(f"{name}: <= {most:,} bytes in {requests} range reads")
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
