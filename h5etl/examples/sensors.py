"""Sensor recordings: a vibration rig's accelerometer, supply voltage and temperature.

Each recording is a folder ``r_NNN/`` holding ``accel.npy`` ((n, 3) float32 at 10 kHz),
``voltage.csv`` (one column at 100 Hz, rate declared) and ``temperature.csv`` (1 Hz, with a
time column of Unix seconds). Recordings last a few seconds each, each its own length. The
benchmark writes the same recordings, longer (``write_recording``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from h5etl.examples.registry import Broken, register

ACCEL_HZ, VOLTAGE_HZ, TEMPERATURE_HZ = 10_000, 100, 1
START = 1_767_225_600.0  # 2026-01-01T00:00:00Z: recordings start an hour apart from here


def accelerometer(rng: np.random.Generator, samples: int) -> np.ndarray:
    """(samples, 3) float32 m/s^2: a shaft's 1x and 2x orders plus noise, gravity on z."""
    t = np.arange(samples) / ACCEL_HZ
    shaft = rng.uniform(20, 60)  # Hz
    out = np.empty((samples, 3), np.float32)
    for axis, gain in enumerate((1.0, 0.6, 0.3)):
        wave = gain * np.sin(2 * np.pi * shaft * t + axis) + 0.3 * gain * np.sin(
            4 * np.pi * shaft * t
        )
        out[:, axis] = wave + rng.normal(0, 0.05, samples)
    out[:, 2] += 9.81
    return out


def voltage_csv(rng: np.random.Generator, samples: int) -> str:
    """A one-column CSV of supply voltage (V) at 100 Hz, 3 decimals as a logger writes it."""
    volts = 24.0 + 0.2 * np.sin(np.arange(samples) / 30) + rng.normal(0, 0.01, samples)
    return "volts\n" + "".join(f"{v:.3f}\n" for v in volts)


def temperature_csv(rng: np.random.Generator, seconds: int, start: float) -> str:
    """A CSV of ``t`` (Unix seconds) and ``celsius`` at 1 Hz, a slow warm-up."""
    rows = [f"{start + i:.1f},{31.5 + 0.02 * i + rng.normal(0, 0.05):.2f}" for i in range(seconds)]
    return "t,celsius\n" + "\n".join(rows) + "\n"


def write_recording(folder: Path, rng: np.random.Generator, seconds: int, start: float) -> None:
    """One recording of ``seconds`` (whole seconds: every channel holds whole samples)."""
    folder.mkdir(parents=True, exist_ok=True)
    np.save(folder / "accel.npy", accelerometer(rng, seconds * ACCEL_HZ))
    (folder / "voltage.csv").write_text(voltage_csv(rng, seconds * VOLTAGE_HZ), encoding="utf-8")
    (folder / "temperature.csv").write_text(
        temperature_csv(rng, seconds * TEMPERATURE_HZ, start), encoding="utf-8"
    )


def _break(folder: Path, reason: str) -> None:
    """Damage a written recording so that the build rejects it for ``reason``."""
    accel = folder / "accel.npy"
    temperature = folder / "temperature.csv"
    if reason == "non_finite":
        values = np.load(accel)
        values[1234, 1] = np.nan
        np.save(accel, values)
    elif reason == "trailing_shape":
        np.save(accel, np.load(accel)[:, :2])
    elif reason == "missing_channel":
        (folder / "voltage.csv").unlink()
    elif reason == "duration_mismatch":
        np.save(accel, np.load(accel)[: len(np.load(accel)) // 2])
    else:  # timestamps: swap two lines, or repeat one
        lines = temperature.read_text(encoding="utf-8").splitlines()
        if reason == "non_monotonic_timestamps":
            lines[3], lines[4] = lines[4], lines[3]
        else:
            lines[4] = lines[3].split(",")[0] + "," + lines[4].split(",")[1]
        temperature.write_text("\n".join(lines) + "\n", encoding="utf-8")


BROKEN = {
    "non_finite": "a NaN in accel.npy at sample 1234, axis 1",
    "trailing_shape": "accel.npy is (n, 2), declared (n, 3)",
    "missing_channel": "no voltage.csv",
    "duration_mismatch": "accel.npy holds half the recording's duration",
    "non_monotonic_timestamps": "temperature.csv has two lines swapped",
    "duplicate_timestamp": "temperature.csv repeats a timestamp",
}


@register(
    "vibration",
    config="vibration.yaml",
    summary="sensor recordings: accelerometer (n, 3) at 10 kHz, voltage at 100 Hz, "
    "temperature at 1 Hz, lengths varying (series kind)",
)
def vibration(raw: Path, *, samples: int = 10, seed: int = 13) -> dict[str, Broken]:
    """``raw/recordings/r_NNN/`` of 3 to 6 s each, and one broken recording per reject of a
    series (NaN, wrong trailing shape, missing channel, durations apart, timestamps going back
    or repeating)."""
    rng = np.random.default_rng(seed)
    broken: dict[str, Broken] = {}
    for index in range(samples + len(BROKEN)):
        name = f"r_{index:03d}" if index < samples else f"r_{900 + index - samples}"
        folder = raw / "recordings" / name
        write_recording(folder, rng, int(rng.integers(3, 7)), START + 3600 * index)
        if index >= samples:
            reason = list(BROKEN)[index - samples]
            _break(folder, reason)
            broken[f"recordings/{name}"] = Broken(reason, BROKEN[reason])
    return broken
