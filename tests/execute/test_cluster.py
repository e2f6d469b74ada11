"""cluster: decoding on a Dask cluster gives the local build's file; its faults are one line.

One ``distributed.LocalCluster`` of two worker processes on loopback serves the whole module
(a cluster start costs seconds). Functions that run in its workers are pickled by value.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cloudpickle  # type: ignore[import-untyped]
import h5py
import numpy as np
import pytest
from conftest import MakeRaw, WriteConfig, dataset_digests, expected_image, read_release

from h5etl.config.load import load_spec
from h5etl.errors import ClusterError, ConfigError
from h5etl.execute import assembly
from h5etl.execute import dask_cluster as cluster
from h5etl.history.build_report import BuildReport
from h5etl.pipeline import planning
from h5etl.pipeline import run as pipeline
from h5etl.plan import tasks

distributed = pytest.importorskip("distributed")


@pytest.fixture(scope="module")
def dask_cluster() -> Iterator[Any]:
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    with distributed.LocalCluster(
        n_workers=2,
        processes=True,
        threads_per_worker=1,
        host="127.0.0.1",
        dashboard_address=":0",
    ) as local:
        yield local
    cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


@pytest.fixture
def client(dask_cluster: Any) -> Iterator[Any]:
    with distributed.Client(dask_cluster, set_as_default=False) as connection:
        yield connection


def _slow_decoding(seconds: float) -> None:
    """In a worker: every decode task takes ``seconds`` longer (so a kill lands mid-build)."""
    import h5etl.decode.task

    original = getattr(h5etl.decode.task, "_original_decode_batch", h5etl.decode.task.decode_batch)

    def slow(task: Any, recipe: Any) -> Any:
        time.sleep(seconds)
        return original(task, recipe)

    setattr(h5etl.decode.task, "_original_decode_batch", original)  # noqa: B010 (not a real attribute)
    h5etl.decode.task.decode_batch = slow


def _normal_decoding() -> None:
    import h5etl.decode.task

    original = getattr(h5etl.decode.task, "_original_decode_batch", None)
    if original is not None:
        h5etl.decode.task.decode_batch = original


def _hide(folder: str, forget: bool = True) -> None:
    """In a worker: act as a host that does not mount ``folder`` (``forget``: a worker that
    has checked nothing yet, one that joined late; else one whose share went away since)."""
    import os.path

    import h5etl.execute.dask_cluster
    import h5etl.execute.sourceviews

    if forget:
        h5etl.execute.dask_cluster._SEEN.clear()
    h5etl.execute.sourceviews.visible = lambda path: path != folder and os.path.isdir(path)  # type: ignore[assignment]


def _unhide() -> None:
    import os.path

    import h5etl.execute.sourceviews

    h5etl.execute.sourceviews.visible = os.path.isdir  # type: ignore[assignment]


def _release(tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig) -> Path:
    make_raw(tmp_path, n=30, broken=["mask_128", "truncated_late"])
    return write_config(tmp_path)


def _published(report: BuildReport) -> Path:
    assert report.path is not None
    return report.path


def test_local_cluster_and_sharded_builds_are_one_release(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig, dask_cluster: Any
) -> None:
    config = _release(tmp_path, make_raw, write_config)
    spec = load_spec(config)
    address = dask_cluster.scheduler_address
    local = pipeline.build(spec, jobs=1)
    builds = {
        # full: decode everything (a build with a parent would carry its unchanged samples)
        "cluster": pipeline.build(spec, scheduler=address, full=True),
        "sharded K=2": pipeline.build(spec, jobs=2, shards=2),
        "sharded K=2 on the cluster": pipeline.build(spec, scheduler=address, shards=2),
    }
    expected = read_release(_published(local))
    # the rows are the source files' pixels (decoded here with Pillow), in write order
    first = Path(str(expected["train/filename"][0])).stem
    np.testing.assert_array_equal(
        expected["train/image"][0], expected_image(tmp_path / "raw/images" / f"{first}.png")
    )
    for how, report in builds.items():
        path = _published(report)
        assert dataset_digests(path) == dataset_digests(_published(local)), how
        assert report.samples == local.samples, how
        data = read_release(path)
        for name, rows in expected.items():
            np.testing.assert_array_equal(data[name], rows, err_msg=f"{how}: {name}")
        assert sorted(r.path for r in report.rejects) == sorted(r.path for r in local.rejects)
        with h5py.File(path) as handle, h5py.File(_published(local)) as before:
            # where decoding ran is not part of the stored config
            assert handle.attrs["config_sha256"] == before.attrs["config_sha256"], how
            assert handle.attrs["source_fingerprint"] == before.attrs["source_fingerprint"], how


def test_the_config_names_the_scheduler(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig, dask_cluster: Any
) -> None:
    make_raw(tmp_path, n=6)
    config = write_config(tmp_path, decode={"scheduler": dask_cluster.scheduler_address})
    spec = load_spec(config)
    assert spec.decode.scheduler == dask_cluster.scheduler_address
    report = pipeline.build(spec)
    assert sum(report.samples.values()) == 6


def test_a_worker_killed_mid_build_is_replaced_and_nothing_is_lost(
    tmp_path: Path,
    make_raw: MakeRaw,
    write_config: WriteConfig,
    dask_cluster: Any,
    client: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(tasks, "TASK_SAMPLES", 4)  # many small tasks: the kill lands among them
    config = _release(tmp_path, make_raw, write_config)
    spec = load_spec(config)
    local = pipeline.build(spec, jobs=1)
    pids = client.run(os.getpid)
    victim = sorted(pids.values())[0]
    client.run(_slow_decoding, 0.15)
    killed: list[int] = []

    def kill_once(stage: str, advance: int, total: int | None) -> None:
        if stage == "decode+write" and total is None and not killed:
            os.kill(victim, signal.SIGKILL)  # as the OOM killer would
            killed.append(victim)

    try:
        remote = pipeline.build(
            spec, scheduler=dask_cluster.scheduler_address, full=True, progress=kill_once
        )
    finally:
        client.run(_normal_decoding)
    assert killed == [victim]
    assert victim not in client.run(os.getpid).values()  # it died (its nanny started another)
    assert dataset_digests(_published(remote)) == dataset_digests(_published(local))
    stored = read_release(_published(remote))
    names = np.concatenate([stored[f"{split}/filename"] for split in ("train", "valid")])
    assert len(names) == len(set(names)) == 30  # none missing, none twice
    assert [r.reason for r in remote.rejects if r.reason == "worker_crashed"] == []


def test_a_worker_that_cannot_see_the_sources_fails_the_build_in_one_line(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig, dask_cluster: Any, client: Any
) -> None:
    raw = make_raw(tmp_path, n=6)
    config = write_config(tmp_path)
    hidden = str(raw.masks)
    address = sorted(client.scheduler_info()["workers"])[0]
    # a healthy cluster builds; then one host's share goes away (its worker saw it before)
    assert pipeline.build(load_spec(config), scheduler=dask_cluster.scheduler_address).path
    client.run(_hide, hidden, False, workers=[address])
    try:
        with pytest.raises(ClusterError) as caught:
            pipeline.build(load_spec(config), scheduler=dask_cluster.scheduler_address)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        command = [sys.executable, "-m", "h5etl", "build", str(config), "-q"]
        cli = subprocess.run(
            [*command, "--scheduler", dask_cluster.scheduler_address],
            capture_output=True,
            text=True,
            env=env,
            check=False,
        )
    finally:
        client.run(_unhide, workers=[address])
    message = str(caught.value)
    assert f"worker {address} on host " in message
    assert f"cannot see the source folder {hidden}" in message
    assert "\n" not in message
    assert cli.returncode == 1
    lines = cli.stderr.strip().splitlines()
    assert len(lines) == 1, cli.stderr
    assert hidden in lines[0]
    assert address in lines[0]
    releases = sorted(p.name for p in (tmp_path / "releases").glob("cells-v*.h5"))
    assert releases == ["cells-v0001.h5"]  # nothing more published


def test_a_worker_joining_late_checks_the_sources_on_its_first_task(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig, dask_cluster: Any, client: Any
) -> None:
    raw = make_raw(tmp_path, n=6)
    spec = load_spec(write_config(tmp_path))
    run = cluster.Cluster(dask_cluster.scheduler_address, assembly.source_roots(spec))
    _, plan, _, _ = planning.plan_only(spec, lambda stage, advance, total: None, 1)
    cutter = assembly.cutter(spec, plan, None)
    try:
        with run:  # the up-front check passes; then the workers act as ones that joined later
            client.run(_hide, str(raw.images))
            results = run.run_tasks(cutter, assembly.recipe_of(plan))
            with pytest.raises(ClusterError, match=r"cannot see the source folder .*images"):
                list(results)
    finally:
        client.run(_unhide)


def test_no_scheduler_at_the_address_is_one_line(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_raw(tmp_path, n=3)
    monkeypatch.setattr(cluster, "CONNECT_SECONDS", 0.5)
    with pytest.raises(ClusterError, match=r"cannot reach the Dask scheduler at tcp://127.0.0.1:9"):
        pipeline.build(load_spec(write_config(tmp_path)), scheduler="tcp://127.0.0.1:9")
    assert not (tmp_path / "releases" / "cells.h5").exists()


def test_an_unreachable_config_scheduler_fails_before_planning_with_a_link(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a linked release a local build starts its workers only if it will decode; a
    cluster named in the config is connected at once all the same, so an address that
    answers nothing fails before discovery, not after planning."""
    make_raw(tmp_path, n=3)
    pipeline.build(load_spec(write_config(tmp_path)), jobs=1)  # the link exists now
    monkeypatch.setattr(cluster, "CONNECT_SECONDS", 0.5)
    stages: list[str] = []
    config = write_config(tmp_path, decode={"scheduler": "tcp://127.0.0.1:9"})
    with pytest.raises(ClusterError, match=r"cannot reach the Dask scheduler at tcp://127.0.0.1:9"):
        pipeline.build(load_spec(config), progress=lambda stage, *_: stages.append(stage))
    assert "discover" not in stages


def test_without_the_dask_extra_the_error_names_it(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_raw(tmp_path, n=3)
    monkeypatch.setitem(sys.modules, "distributed", None)  # import distributed fails
    with pytest.raises(ClusterError, match=r"pip install 'h5etl\[dask\]'"):
        pipeline.build(load_spec(write_config(tmp_path)), scheduler="tcp://127.0.0.1:8786")


@pytest.mark.parametrize("address", ["tcp//host", "host port", ""])
def test_a_scheduler_that_is_no_address_is_a_config_error(
    tmp_path: Path, write_config: WriteConfig, make_raw: MakeRaw, address: str
) -> None:
    make_raw(tmp_path, n=1)
    with pytest.raises(ConfigError, match=r"decode\.scheduler"):
        load_spec(write_config(tmp_path, decode={"scheduler": address}))


def test_a_cluster_build_is_the_local_build_byte_for_byte(
    tmp_path: Path,
    make_raw: MakeRaw,
    write_config: WriteConfig,
    dask_cluster: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")  # reproducible bytes
    files = []
    for name, scheduler in (("local", "local"), ("cluster", dask_cluster.scheduler_address)):
        folder = tmp_path / name
        folder.mkdir()
        make_raw(folder, n=12, broken=["mask_128"])
        report = pipeline.build(load_spec(write_config(folder)), jobs=2, scheduler=scheduler)
        files.append(_published(report))
    assert files[0].read_bytes() == files[1].read_bytes()


def test_an_incremental_build_on_the_cluster_decodes_beside_the_copy(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig, dask_cluster: Any
) -> None:
    # the carried blocks are copied while the cluster decodes the new samples (a thread
    # pulls its results): the same release as the same build decoded locally
    address = dask_cluster.scheduler_address
    made = []
    for where in ("local", "cluster"):
        root = tmp_path / where
        make_raw(root, n=20)
        config = write_config(root, storage={"chunk_samples": 4})
        pipeline.build(load_spec(config), jobs=1)
        make_raw(root, n=26)  # six pairs more (the first twenty are written again alike)
        report = pipeline.build(
            load_spec(config), jobs=1, scheduler=address if where == "cluster" else None
        )
        assert 0 < report.reused < 26
        made.append(_published(report))
    assert dataset_digests(made[0]) == dataset_digests(made[1])
