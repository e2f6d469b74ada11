"""The ``filesize`` kind passes h5etl's kind contract, as this plugin's own CI runs it:
``pip install`` the plugin, then ``pytest`` here. h5etl finds the kind through its
``h5etl.kinds`` entry point when the config is first read, so the plugin must be installed
(or on ``PYTHONPATH``) before pytest starts: h5etl's test suite runs this module in a pytest
subprocess (tests/kinds/test_plugin_kind.py), never in its own process.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from h5etl.testing import Broken, KindContractTests

SIZES = (0, 1, 3, 4, 5, 40, 77, 120, 299)  # bytes: empty, shorter and longer than the head
MAX_BYTES = 300  # the config's max_bytes: a larger file is a reject (too_large)

CONFIG = f"""\
name: sizes
sources:
  files: {{dir: raw, glob: "*.bin"}}
splits: {{train: 0.75, valid: 0.25}}
storage: {{chunk_samples: 2}}
fields:
  size: {{kind: filesize, max_bytes: {MAX_BYTES}}}
max_rejects: null  # break_input's reject: 1 of 9 files, over the default 5 %
"""


class TestFileSizeContract(KindContractTests):
    field = "size"

    def make_raw(self, root: Path) -> Path:
        rng = np.random.default_rng(7)
        (root / "raw").mkdir()
        for i, size in enumerate(SIZES):
            (root / "raw" / f"f{i:02d}.bin").write_bytes(rng.bytes(size))
        (root / "config.yaml").write_text(CONFIG, "utf-8")
        return root / "config.yaml"

    def break_input(self, root: Path) -> Broken:
        path = root / "raw" / "f03.bin"
        path.write_bytes(bytes(MAX_BYTES + 1))
        return Broken(key="f03", path=path, reason="too_large")

    def expected(self, root: Path) -> dict[str, int]:
        return {path.stem: path.stat().st_size for path in (root / "raw").glob("*.bin")}
