"""Sources on object storage: ``h5etl build`` of the benchmark corpus from a local S3 server
(moto's server mode, a process of its own on localhost) against the same corpus on local disk.

    python tests/benchmarks/remote_sources.py                      # 3000 pairs, 3 repeats, -j2
    python tests/benchmarks/remote_sources.py --samples 600 --repeats 5

Both builds run as child processes, interleaved (local, s3, local, s3, ...); the table shows
medians: wall, images/s, CPU of the build's process tree, and the CPU the server spent per s3
build (moto is a Python server on the same cores as the build: its CPU is the build's loss here,
where a real store's is on other machines). The ratio s3/local is of images per second.
A script, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from corpus import DEFAULT_DIR, DEFAULT_SAMPLES, CorpusParams, ensure_corpus

BUCKET = "h5etl-bench"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _server(port: int, log: Path) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    for _ in range(300):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/moto-api/", timeout=1):
                return process
        except OSError:
            time.sleep(0.1)
    process.kill()
    raise SystemExit(f"the moto server did not start: {log.read_text()[-2000:]}")


def _environment(endpoint: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(
        AWS_ACCESS_KEY_ID="bench",
        AWS_SECRET_ACCESS_KEY="bench-secret",
        AWS_ENDPOINT_URL=endpoint,
        AWS_DEFAULT_REGION="us-east-1",
        AWS_SHARED_CREDENTIALS_FILE=os.devnull,
        AWS_CONFIG_FILE=os.devnull,
        AWS_EC2_METADATA_DISABLED="true",
    )
    return env


def _upload(root: Path, endpoint: str) -> None:
    import boto3

    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="bench",
        aws_secret_access_key="bench-secret",
    )
    client.create_bucket(Bucket=BUCKET)
    files = [p for folder in ("images", "masks") for p in sorted((root / folder).iterdir())]

    def put(path: Path) -> None:
        key = path.relative_to(root).as_posix()
        client.put_object(Bucket=BUCKET, Key=key, Body=path.read_bytes())

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(put, files))


def _configs(corpus_config: Path, scratch: Path) -> dict[str, Path]:
    """The corpus's lzf config as is (local) and with its sources in the bucket (s3), each
    building into its own scratch folder."""
    text = corpus_config.read_text(encoding="utf-8")
    local = text.replace("dir: images", f"dir: {corpus_config.parent / 'images'}").replace(
        "dir: masks", f"dir: {corpus_config.parent / 'masks'}"
    )
    remote = text.replace("dir: images", f'dir: "s3://{BUCKET}/images"').replace(
        "dir: masks", f'dir: "s3://{BUCKET}/masks"'
    )
    out = {}
    for name, body in (("local", local), ("s3", remote)):
        folder = scratch / name
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.yaml").write_text(body, encoding="utf-8")
        out[name] = folder / "config.yaml"
    return out


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _build(config: Path, jobs: int, env: dict[str, str]) -> tuple[float, float]:
    """Wall and CPU seconds (process tree) of one ``h5etl build`` from scratch."""
    shutil.rmtree(config.parent / "releases", ignore_errors=True)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    cmd = [sys.executable, "-m", "h5etl", "build", str(config), "-j", str(jobs), "-q"]
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR, help="corpus folder (cached)")
    parser.add_argument("--samples", type=int, default=DEFAULT_SAMPLES)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args(argv)
    corpus = ensure_corpus(args.dir, CorpusParams(samples=args.samples))
    scratch = Path(tempfile.mkdtemp(prefix="h5etl-remote-bench-"))
    port = _free_port()
    endpoint = f"http://127.0.0.1:{port}"
    server = _server(port, scratch / "moto.log")
    try:
        started = time.perf_counter()
        _upload(corpus.root, endpoint)
        print(f"uploaded {2 * args.samples} objects in {time.perf_counter() - started:.1f} s")
        configs = _configs(corpus.config("lzf"), scratch)
        env = _environment(endpoint)
        runs: dict[str, list[tuple[float, float, float]]] = {"local": [], "s3": []}
        for _ in range(args.repeats):
            for name, config in configs.items():
                served = _cpu_seconds(server.pid)
                wall, cpu = _build(config, args.jobs, env)
                runs[name].append((wall, cpu, _cpu_seconds(server.pid) - served))
        _table(runs, args.samples, args.jobs)
    finally:
        server.terminate()
        server.wait(timeout=10)
        shutil.rmtree(scratch, ignore_errors=True)


def _table(runs: dict[str, list[tuple[float, float, float]]], samples: int, jobs: int) -> None:
    print(f"\n{samples} pairs, -j{jobs}, medians of {len(runs['local'])} interleaved runs\n")
    print("| sources | wall s | images/s | build CPU s | server CPU s |")
    print("|---|---|---|---|---|")
    speed = {}
    for name, got in runs.items():
        wall = statistics.median(r[0] for r in got)
        cpu = statistics.median(r[1] for r in got)
        served = statistics.median(r[2] for r in got)
        speed[name] = samples / wall
        print(f"| {name} | {wall:.2f} | {speed[name]:.0f} | {cpu:.2f} | {served:.2f} |")
    print(f"\ns3 / local images/s: {speed['s3'] / speed['local']:.2f}x")


if __name__ == "__main__":
    main()
