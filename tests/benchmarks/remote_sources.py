"""Sources on object storage: ``h5etl build`` of the benchmark corpus from a local S3 server
(a process of its own on localhost) against the same corpus on local disk.

    python tests/benchmarks/remote_sources.py                      # 3000 pairs, 3 repeats, -j2
    python tests/benchmarks/remote_sources.py --server moto --samples 600 --repeats 5

Both builds run as child processes, interleaved (local, s3, local, s3, ...); the table shows
medians: wall, images/s, CPU of the build's process tree, and the CPU the server spent per s3
build (the server runs on the same cores as the build: its CPU is the build's loss here, where
a real store's is on other machines). The ratio s3/local is of images per second. With obstore
installed the s3 build's workers GET through it (``h5etl.remote.direct``), and a third build,
``s3, s3fs GETs``, sends them through s3fs/aiobotocore as without it. ``--variant old=TREE``
adds a build from the bucket with the h5etl of another source tree (an A/B in one run).

``--pin`` puts the server on the machine's last core and every build on the others (Linux), as
a real store is on machines of its own: the ratio is then what the build's own side allows,
where without it the server's CPU comes out of the build's cores (pass ``--jobs`` for the
cores left, ``--jobs 1`` on two cores).

``--server s3rver`` (the default) is s3rver, a Node.js S3 server that serves objects from files
(``npm install s3rver@3.7.1`` in ``$S3RVER_DIR``, default /tmp/s3rver); ``--server moto`` is
moto's server mode (Python, ~3 ms of CPU per GET). A script, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from corpus import DEFAULT_DIR, DEFAULT_SAMPLES, CorpusParams, ensure_corpus

BUCKET = "h5etl-bench"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


S3RVER = Path(os.environ.get("S3RVER_DIR", "/tmp/s3rver")) / "node_modules/s3rver/bin/s3rver.js"
# The keys each server accepts (s3rver knows one pair; moto any)
KEYS = {"moto": ("bench", "bench-secret"), "s3rver": ("S3RVER", "S3RVER")}


def _on_cores(cores: set[int] | None) -> Any:
    """A ``preexec_fn`` that keeps the child (and what it starts) on ``cores``; None: any."""
    if cores is None:
        return None
    return lambda: os.sched_setaffinity(0, cores)


def _split_cores(pin: bool) -> tuple[set[int] | None, set[int] | None]:
    """(the server's cores, the builds') for ``--pin``: the last core, and the others."""
    if not pin:
        return None, None
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        raise SystemExit("--pin needs two cores or more: one for the server, the rest to build")
    return {cores[-1]}, set(cores[:-1])


def _server(
    kind: str, port: int, scratch: Path, cores: set[int] | None = None
) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    if kind == "moto":
        command = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    elif kind == "s3rver":
        if not S3RVER.is_file():
            raise SystemExit(f"no s3rver at {S3RVER}: npm install s3rver@3.7.1 (or --server moto)")
        data = scratch / "s3rver-data"
        data.mkdir()
        # s3rver 3.7 signs its listings' continuation tokens with DES, which OpenSSL 3 (Node
        # >= 17) has only in its legacy provider: without it a listing past 1000 keys fails
        legacy = "--openssl-legacy-provider"
        command = ["node", legacy, str(S3RVER), "-a", "127.0.0.1", "-p", str(port), "-d", str(data)]
    else:
        raise SystemExit(f"unknown server {kind!r}: s3rver or moto")
    log = scratch / f"{kind}.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env=env, preexec_fn=_on_cores(cores)
        )
    for _ in range(300):
        if process.poll() is not None:
            break
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=1):
                return process
        except urllib.error.HTTPError:
            return process  # it answers (403 for an anonymous GET of /)
        except OSError:
            time.sleep(0.1)
    process.kill()
    raise SystemExit(f"the {kind} server did not start: {log.read_text()[-2000:]}")


def _environment(endpoint: str, keys: tuple[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(
        AWS_ACCESS_KEY_ID=keys[0],
        AWS_SECRET_ACCESS_KEY=keys[1],
        AWS_ENDPOINT_URL=endpoint,
        AWS_DEFAULT_REGION="us-east-1",
        AWS_SHARED_CREDENTIALS_FILE=os.devnull,
        AWS_CONFIG_FILE=os.devnull,
        AWS_EC2_METADATA_DISABLED="true",
    )
    return env


def _upload(root: Path, endpoint: str, keys: tuple[str, str]) -> None:
    import boto3

    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id=keys[0],
        aws_secret_access_key=keys[1],
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


def _variants(
    configs: dict[str, Path], endpoint: str, keys: tuple[str, str]
) -> dict[str, tuple[Path, dict[str, str]]]:
    """The builds to time: local, s3 (the workers' GETs through obstore when it is installed)
    and, then, s3 with every GET through s3fs (``H5ETL_S3_CLIENT=s3fs``)."""
    env = _environment(endpoint, keys)
    variants = {"local": (configs["local"], env), "s3": (configs["s3"], env)}
    if importlib.util.find_spec("obstore") is not None:
        variants["s3, s3fs GETs"] = (configs["s3"], {**env, "H5ETL_S3_CLIENT": "s3fs"})
    return variants


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _build(
    config: Path, jobs: int, env: dict[str, str], cores: set[int] | None = None
) -> tuple[float, float]:
    """Wall and CPU seconds (process tree) of one ``h5etl build`` from scratch (on
    ``cores``, if given)."""
    shutil.rmtree(config.parent / "releases", ignore_errors=True)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    cmd = [sys.executable, "-m", "h5etl", "build", str(config), "-j", str(jobs), "-q"]
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, preexec_fn=_on_cores(cores))
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
    parser.add_argument("--server", choices=sorted(KEYS), default="s3rver")
    parser.add_argument(
        "--pin", action="store_true", help="the server on the last core, the builds on the rest"
    )
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME=TREE",
        help="also build from the bucket with another h5etl source tree (PYTHONPATH=TREE)",
    )
    args = parser.parse_args(argv)
    corpus = ensure_corpus(args.dir, CorpusParams(samples=args.samples))
    scratch = Path(tempfile.mkdtemp(prefix="h5etl-remote-bench-"))
    port = _free_port()
    endpoint = f"http://127.0.0.1:{port}"
    serving, building = _split_cores(args.pin)
    server = _server(args.server, port, scratch, serving)
    keys = KEYS[args.server]
    try:
        started = time.perf_counter()
        _upload(corpus.root, endpoint, keys)
        print(f"uploaded {2 * args.samples} objects in {time.perf_counter() - started:.1f} s")
        variants = _variants(_configs(corpus.config("lzf"), scratch), endpoint, keys)
        for name, tree in (v.split("=", 1) for v in args.variant):
            config, env = variants["s3"]
            variants[f"s3, {name}"] = (config, {**env, "PYTHONPATH": str(Path(tree).resolve())})
        runs: dict[str, list[tuple[float, float, float]]] = {name: [] for name in variants}
        for _ in range(args.repeats):
            for name, (config, env) in variants.items():
                served = _cpu_seconds(server.pid)
                wall, cpu = _build(config, args.jobs, env, building)
                runs[name].append((wall, cpu, _cpu_seconds(server.pid) - served))
        where = ""
        if serving is not None and building is not None:
            where = f", server on core {min(serving)}, builds on {sorted(building)}"
        _table(runs, args.samples, args.jobs, args.server + where)
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:  # moto, still answering a stopped build's requests
            server.kill()
            server.wait()
        shutil.rmtree(scratch, ignore_errors=True)


def _table(
    runs: dict[str, list[tuple[float, float, float]]], samples: int, jobs: int, server: str
) -> None:
    print(f"\n{samples} pairs, -j{jobs}, server {server}, medians of {len(runs['local'])} runs\n")
    print("| sources | wall s | images/s | build CPU s | server CPU s |")
    print("|---|---|---|---|---|")
    speed, cpu, served = {}, {}, {}
    for name, got in runs.items():
        wall = statistics.median(r[0] for r in got)
        cpu[name] = statistics.median(r[1] for r in got)
        served[name] = statistics.median(r[2] for r in got)
        speed[name] = samples / wall
        print(f"| {name} | {wall:.2f} | {speed[name]:.0f} | {cpu[name]:.2f} | {served[name]:.2f} |")
    print()
    objects = 2 * samples
    for name in runs:
        if name != "local":
            print(
                f"{name} / local images/s: {speed[name] / speed['local']:.2f}x; build CPU over "
                f"local {1000 * (cpu[name] - cpu['local']) / objects:.2f} ms and server CPU "
                f"{1000 * served[name] / objects:.2f} ms per object"
            )


if __name__ == "__main__":
    main()
