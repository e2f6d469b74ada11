"""batch: many configs, one command. ``h5etl build configs/`` builds each config in turn.

Every config is read first, so an invalid one is reported before any work, and two configs
that would build the same release (one name in one output folder) are refused. Then each
valid config builds as ``h5etl build CONFIG`` would, under its own lock; a failing build does
not stop the next. The outcome of each is one row of a summary table, and the exit code is
the worst one: 0 every build succeeded, 1 a build failed, 2 a config was invalid (the set of
configs needs fixing), 130 interrupted (the configs after it are not built).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from h5etl.errors import ConfigError, H5EtlError, UsageError
from h5etl.units import human_size

if TYPE_CHECKING:
    from h5etl.config.spec import Spec
    from h5etl.history.build_report import BuildReport

__all__ = ["CONFIG_SUFFIXES", "Outcome", "build_all", "config_files", "exit_code", "summary_lines"]

CONFIG_SUFFIXES = (".yaml", ".yml")
OK, FAILED, INVALID, NOT_BUILT = "ok", "failed", "invalid", "not built"
UP_TO_DATE = "up to date"  # an ok outcome that published nothing: nothing had changed


@dataclass(slots=True)
class Outcome:
    """What became of one config: ``ok``, ``failed``, ``invalid`` or ``not built``."""

    config: Path
    state: str = NOT_BUILT
    spec: Spec | None = None
    report: BuildReport | None = None
    error: str = ""
    exit_code: int = 0

    @property
    def name(self) -> str:
        return self.spec.name if self.spec is not None else "-"


def config_files(paths: Sequence[Path]) -> list[Path]:
    """The config files ``paths`` name: each file as given, each folder's ``*.yaml`` and
    ``*.yml`` (not hidden, not in subfolders), by name; a file named twice counts once.

    Raises:
        UsageError: a path is not there, or a folder holds no config (exit code 2).
    """
    found: list[Path] = []
    for path in paths:
        if path.is_dir():
            inside = sorted(
                p
                for p in path.iterdir()
                if p.suffix in CONFIG_SUFFIXES and p.is_file() and not p.name.startswith(".")
            )
            if not inside:
                raise UsageError("no *.yaml or *.yml config in this folder", path=path)
            found.extend(inside)
        elif path.exists():
            found.append(path)
        else:
            raise UsageError("no such config file or folder", path=path)
    unique: dict[Path, Path] = {}
    for path in found:
        unique.setdefault(path.resolve(), path)
    return list(unique.values())


def _read_all(configs: Sequence[Path], load: Callable[[Path], Spec]) -> list[Outcome]:
    outcomes = [Outcome(config) for config in configs]
    claimed: dict[tuple[Path | str, str], Path] = {}  # (output folder, name) -> its first config
    for outcome in outcomes:
        try:
            outcome.spec = load(outcome.config)
        except (ConfigError, UsageError) as exc:
            outcome.state, outcome.error, outcome.exit_code = INVALID, str(exc), exc.exit_code
            continue
        output = outcome.spec.output
        release = (output.resolve() if isinstance(output, Path) else output, outcome.spec.name)
        first = claimed.setdefault(release, outcome.config)
        if first != outcome.config:
            outcome.state, outcome.exit_code = INVALID, 2
            outcome.error = (
                f"{outcome.config}: builds the same release as {first} ({outcome.spec.name!r} "
                f"in {outcome.spec.output}); give one of them another name or output"
            )
    return outcomes


def build_all(
    configs: Sequence[Path],
    *,
    load: Callable[[Path], Spec],
    build: Callable[[Spec], BuildReport],
    started: Callable[[Outcome], None] = lambda outcome: None,
    done: Callable[[Outcome], None] = lambda outcome: None,
) -> list[Outcome]:
    """Read every config, then build each valid one in turn with ``build(spec)``.

    ``started`` and ``done`` are called around each build (the CLI prints there). A build
    error (``H5EtlError``) is its outcome and the next config builds; Ctrl-C stops them all
    (``KeyboardInterrupt`` propagates after ``done``: the outcomes say which were built).
    """
    outcomes = _read_all(configs, load)
    for outcome in outcomes:
        if outcome.state == INVALID:
            done(outcome)
    for outcome in outcomes:
        if outcome.state == INVALID or outcome.spec is None:
            continue
        started(outcome)
        try:
            outcome.report = build(outcome.spec)
            outcome.state = OK
        except H5EtlError as exc:
            outcome.state, outcome.error, outcome.exit_code = FAILED, str(exc), exc.exit_code
            if outcome.exit_code == 2:
                outcome.state = INVALID  # found by the build (a sidecar table), not by loading
        except KeyboardInterrupt:  # Ctrl-C stops them all: the rest stay "not built"
            outcome.state, outcome.exit_code = FAILED, 130
            outcome.error = f"{outcome.config}: interrupted; nothing was published"
            done(outcome)
            break
        done(outcome)
    return outcomes


def exit_code(outcomes: Sequence[Outcome]) -> int:
    """The worst outcome's code: 130 interrupted, 2 an invalid config, 1 a failed build, 0."""
    codes = {outcome.exit_code for outcome in outcomes}
    for code in (130, 2, 1):
        if code in codes:
            return code
    return max(codes, default=0)


def _row(outcome: Outcome) -> list[str]:
    report = outcome.report
    if outcome.state != OK or report is None:
        return [str(outcome.config), outcome.name, outcome.state, "-", "-", "-", "-"]
    release = f"v{report.version:04d}" if report.version is not None else "dry run"
    size = human_size(report.stored_bytes) if report.path is not None else "-"
    stored = f"{size} in {report.seconds.get('total', 0.0):.1f} s"
    return [
        str(outcome.config),
        outcome.name,
        UP_TO_DATE if report.up_to_date else outcome.state,
        release,
        f"{sum(report.samples.values()):,}",
        f"{len(report.rejects):,}",
        "no new release" if report.up_to_date else stored,
    ]


def summary_lines(outcomes: Sequence[Outcome]) -> list[str]:
    """The table printed after every build: one row per config, then each error in full."""
    rows = [["config", "name", "result", "release", "samples", "rejects", "stored"]]
    rows.extend(_row(outcome) for outcome in outcomes)
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
             for row in rows]  # fmt: skip
    built = sum(outcome.state == OK for outcome in outcomes)
    current = sum(o.report is not None and o.report.up_to_date for o in outcomes if o.state == OK)
    also = f" ({current} of them up to date: nothing changed)" if current else ""
    lines.append(f"{built} of {len(outcomes)} configs built{also}")
    lines.extend(
        f"{outcome.state}: {line}"
        for outcome in outcomes
        if outcome.error
        for line in outcome.error.splitlines()
    )
    return lines
