"""provenance: what a release says about how it was made, and what its build's run was like.

The file holds what the inputs and config determine (root attributes, ``/diagnostics``), so
the same inputs make the same bytes; the run's own facts (timings, ``--jobs``, host) go to
``<name>-vNNNN.build.json`` beside it (``clock``).
"""

from __future__ import annotations

import hashlib
import platform
import socket
from typing import TYPE_CHECKING, Any

import h5py
import numpy as np

from h5etl._version import __version__
from h5etl.config.spec import Spec, spec_sha256, spec_text
from h5etl.dataflow import BatchResult, valid_text
from h5etl.history import clock
from h5etl.history.build_report import BuildReport
from h5etl.plan.result import Plan

if TYPE_CHECKING:
    from h5etl.transforms.apply import Transforms


def file_attrs(
    spec: Spec, version: int, fingerprint: hashlib._Hash, created_at: str
) -> dict[str, Any]:
    """The root attributes: the config, its digest, the tools, the source fingerprint."""
    source_fingerprint = fingerprint.hexdigest()
    return {
        **spec.attrs,
        "name": spec.name,
        "version": version,
        "description": spec.description,
        "notes": spec.notes,  # fileformat.NOTES_ATTR
        "created_at": created_at,
        "config": spec_text(spec),
        "config_sha256": spec_sha256(spec),
        "h5etl_version": __version__,
        "h5py_version": h5py.version.version,
        "hdf5_version": h5py.version.hdf5_version,
        "source_fingerprint": source_fingerprint,
    }


def diagnostics(report: BuildReport, plan: Plan) -> dict[str, Any]:
    """``/diagnostics``: what was stored and left out. Nothing of the clock or the machine
    (those are build facts), so that the same inputs make the same bytes."""
    out: dict[str, Any] = {"inputs": report.inputs}
    out["rejects_total"] = len(report.rejects)
    for reason, count in report.reject_counts.items():
        out[f"rejects_{reason}"] = count
    for split, count in report.samples.items():
        out[f"samples_{split}"] = count
    out["renamed_keys"] = [f"{valid_text(old)} -> {new}" for old, new in plan.renamed]
    if plan.transforms is not None:  # only a build that ran user code records it (issue 28)
        from h5etl.transforms.loading import canonical_json

        out[TRANSFORMS_ATTR] = canonical_json(transforms_lineage(plan.transforms))
    return out


TRANSFORMS_ATTR = "transforms"  # of /diagnostics: the code that made the values, as JSON


def transforms_lineage(transforms: Transforms) -> dict[str, Any]:
    """What the lineage records of a build's user code: every call with its identity (the
    layout record's, ``describe``), the modules imported and the libraries' versions the
    transforms ran with (numpy, each distribution a transform comes from). No path, host or
    time: the same config and code give the same record anywhere."""
    from h5etl.transforms.identity import describe, identity_of

    described = describe(transforms)
    calls = [spec for chain in transforms.chains for spec in chain.calls]
    calls += [step.call for step in transforms.sample_calls]
    calls += [derived.call for derived in transforms.derived]
    modules: dict[str, dict[str, Any]] = {}
    libraries = {"numpy": np.__version__, "python": platform.python_version()}
    for spec in calls:
        identity = identity_of(spec)
        modules.setdefault(
            identity.module,
            {"origin": identity.origin, "sha256": identity.source_sha256},
        )
        if identity.distribution is not None and identity.version is not None:
            libraries[identity.distribution] = identity.version
    return {**described, "modules": modules, "libraries": libraries}


def build_facts(report: BuildReport, jobs: int) -> dict[str, Any]:
    """What this build's run was like (``<name>-vNNNN.build.json``): the stage timings, the
    workers, the machine; facts two builds of the same file need not share."""
    return {
        "created_at": report.created_at,
        "built_at": clock.created_at(None),
        "host": socket.gethostname(),
        "jobs": jobs,
        "seconds": dict(report.seconds),
        "chunk_paths": dict(report.chunk_paths),
        "resumed_samples": report.resumed,
        "h5etl_version": __version__,
    }


def fingerprint_lines(result: BatchResult) -> list[str]:
    """``key<TAB>sha256,sha256<LF>`` per accepted sample: what the source fingerprint hashes,
    in write order (a sharded build's shards record them for the committer)."""
    return [
        f"{key}\t{','.join(hashes)}\n"
        for key, hashes in zip(result.keys, result.lineage, strict=True)
    ]
