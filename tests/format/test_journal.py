"""journal: the chunk table of a checkpoint reads back as it was written; a damaged one ends
the journal there; checkpoints space out as they cost more."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from h5etl.format import journal
from h5etl.resume.journal_use import CHECKPOINT_SHARE, MAX_CHECKPOINT_SECONDS, checkpoint_interval

DATASETS = ["/train/ct", "/train/image", "/valid/mask"]
RANKS = [3, 4, 2]

chunk = st.tuples(
    st.integers(0, len(DATASETS) - 1),
    st.lists(st.integers(0, 2**40), min_size=4, max_size=4),
    st.tuples(st.integers(0, 2**32 - 1), st.integers(0, 2**62), st.integers(0, 2**40)),
    st.binary(min_size=1, max_size=8),
)


@given(st.lists(chunk, max_size=40))
def test_a_chunk_table_reads_back_as_written(chunks: list[tuple[Any, ...]]) -> None:
    which = [c[0] for c in chunks]
    offsets = [tuple(c[1][: RANKS[c[0]]]) for c in chunks]
    places = [c[2] for c in chunks]
    digests = [hashlib.sha256(c[3]).hexdigest() for c in chunks]
    table = journal.pack_chunks(DATASETS, which, offsets, places, digests)
    text = json.loads(json.dumps(table))  # as a journal line carries it
    expected = [
        journal.WrittenChunk(DATASETS[w], o, p[0], p[1], p[2], d)
        for w, o, p, d in zip(which, offsets, places, digests, strict=True)
    ]
    assert journal.unpack_chunks(text) == expected


def _journal(path: Path, tables: list[dict[str, Any]]) -> None:
    writer = journal.JournalWriter(path, config_sha256="c", plan_sha256="p")
    for table in tables:
        writer.checkpoint(
            {
                "queues": {},
                "rows": {"train": 1},
                "chunks": table,
                "blocks": {},
                "texts": {},
                "lineage": {},
                "fingerprint": [],
                "rejects": [],
            }
        )
    writer.close()


def test_a_damaged_chunk_table_ends_what_the_journal_is_trusted_for(tmp_path: Path) -> None:
    sha = hashlib.sha256(b"x").hexdigest()
    good = journal.pack_chunks(["/train/ct"], [0], [(0, 0, 0)], [(0, 4096, 10)], [sha])
    short = dict(good, sha256=good["sha256"][:8])  # digests cut short
    later = journal.pack_chunks(["/train/ct"], [0], [(1, 0, 0)], [(0, 4106, 10)], [sha])
    _journal(tmp_path / "j", [good, short, later])
    state = journal.read(tmp_path / "j")
    assert state is not None
    assert state.chunks == [journal.WrittenChunk("/train/ct", (0, 0, 0), 0, 4096, 10, sha)]


def test_a_journal_of_the_previous_format_is_not_resumed(tmp_path: Path) -> None:
    # format 4 listed a JSON object per chunk; this h5etl builds from the start instead
    path = tmp_path / "j"
    path.write_text(json.dumps({"format": 4, "config_sha256": "c", "plan_sha256": "p"}) + "\n")
    assert journal.read(path) is None


@pytest.mark.parametrize(
    ("every", "cost", "expected"),
    [
        pytest.param(2.0, 0.01, 2.0, id="cheap: every 2 s"),
        pytest.param(0.5, 0.1, 0.1 / CHECKPOINT_SHARE, id="costly: spaced by its cost"),
        pytest.param(0.5, 2.0, MAX_CHECKPOINT_SECONDS, id="very costly: never far behind"),
        pytest.param(60.0, 2.0, 60.0, id="asked for seldom: as asked"),
        pytest.param(0.0, 0.5, 0.0, id="every batch (tests): always"),
    ],
)
def test_checkpoints_space_out_as_they_cost_more(
    every: float, cost: float, expected: float
) -> None:
    assert checkpoint_interval(every, cost) == pytest.approx(expected)
