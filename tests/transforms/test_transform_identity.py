"""The code identity of a call (issue 28, item 5): the same record in any process and any
folder, changed by the module's bytes and the arguments, per field as the values flow."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np

from h5etl._version import __version__
from h5etl.transforms.apply import FieldChain, SampleCall, Transforms
from h5etl.transforms.identity import CodeIdentity, describe, field_digests, identity_of
from h5etl.transforms.loading import Loader

PREP = """
def invert(value, *, top=255):
    return top - value

def noisy(value, *, rng):
    return value + rng.normal(size=value.shape)

def body_crop(sample):
    return sample
"""


def _folder(tmp_path: Path, source: str = PREP, name: str = "configs") -> Path:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "prep.py").write_text(textwrap.dedent(source))
    return folder


def test_an_identity_is_the_same_in_another_process_and_folder(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    here = identity_of(Loader(folder).resolve("prep:invert", {"top": 200}))
    assert here.as_json() == {
        "call": "prep:invert",
        "module": "prep",
        "origin": "beside_config",
        "source_sha256": here.source_sha256,
        "distribution": None,
        "version": None,
        "args": '{"top":200}',
    }
    moved = tmp_path / "elsewhere"
    shutil.copytree(folder, moved)
    assert identity_of(Loader(moved).resolve("prep:invert", {"top": 200})) == here
    code = (
        "import sys; from pathlib import Path\n"
        "from h5etl.transforms.loading import Loader\n"
        "from h5etl.transforms.identity import identity_of\n"
        "print(identity_of(Loader(Path(sys.argv[1])).resolve('prep:invert', {'top': 200})).digest)"
    )
    there = subprocess.run(
        [sys.executable, "-c", code, str(moved)], capture_output=True, text=True, check=True
    )
    assert there.stdout.strip() == here.digest
    assert CodeIdentity.from_json(json.loads(json.dumps(here.as_json()))) == here


def test_the_bytes_and_the_args_change_the_identity(tmp_path: Path) -> None:
    first = identity_of(Loader(_folder(tmp_path)).resolve("prep:invert", {"top": 200}))
    assert (
        identity_of(Loader(_folder(tmp_path, name="b")).resolve("prep:invert", {"top": 9})) != first
    )
    edited = _folder(tmp_path, PREP + "\n# a comment is code too\n", name="c")
    changed = identity_of(Loader(edited).resolve("prep:invert", {"top": 200}))
    assert changed.source_sha256 != first.source_sha256
    assert changed.digest != first.digest


def test_a_builtin_is_named_by_h5etls_version() -> None:
    found = identity_of(Loader(None).resolve("crop", {"size": [4, 4]}))
    assert (found.distribution, found.version, found.source_sha256) == ("h5etl", __version__, None)
    assert found.args == '{"size":[4,4]}'


def test_an_installed_module_names_its_distribution() -> None:
    found = identity_of(Loader(None).resolve("numpy.fft:fftshift"))
    assert (found.distribution, found.version) == ("numpy", np.__version__)
    assert found.origin == "installed"
    assert found.source_sha256 is not None
    stdlib = identity_of(Loader(None).resolve("textwrap:dedent"))
    assert stdlib.distribution == "python"


def _transforms(loader: Loader, *, top: int = 200, crop: int = 8, seed: int = 0) -> Transforms:
    return Transforms(
        seed,
        chains=(
            FieldChain("image", (loader.resolve("prep:invert", {"top": top}),)),
            FieldChain("mask", (loader.resolve("crop", {"size": [crop, crop]}),)),
            FieldChain("depth", (loader.resolve("prep:noisy"),)),
        ),
    )


def test_a_field_digest_changes_with_its_own_code_only(tmp_path: Path) -> None:
    loader = Loader(_folder(tmp_path))
    base = field_digests(_transforms(loader))
    assert set(base) == {"image", "mask", "depth"}
    changed = field_digests(_transforms(loader, top=100))
    assert [f for f in base if base[f] != changed[f]] == ["image"]
    # the seed reaches only the fields whose calls draw random numbers
    reseeded = field_digests(_transforms(loader, seed=1))
    assert [f for f in base if base[f] != reseeded[f]] == ["depth"]


def test_a_sample_call_ties_the_fields_it_sees(tmp_path: Path) -> None:
    loader = Loader(_folder(tmp_path))
    joint = SampleCall(loader.resolve("prep:body_crop"), ("image", "mask"))

    def digests(top: int) -> dict[str, str]:
        image = FieldChain("image", (loader.resolve("prep:invert", {"top": top}),))
        return field_digests(Transforms(0, chains=(image,), sample_calls=(joint,)))

    # the mask's value comes from a crop that read the image: the image's code reaches it
    first, second = digests(200), digests(100)
    assert first["mask"] != second["mask"]
    assert first["image"] != second["image"]


def test_describe_is_json_for_the_layout_record(tmp_path: Path) -> None:
    loader = Loader(_folder(tmp_path))
    joint = SampleCall(loader.resolve("prep:body_crop"), ("image", "mask"))
    record = describe(Transforms(5, chains=_transforms(loader).chains, sample_calls=(joint,)))
    assert json.loads(json.dumps(record)) == record
    assert record["seed"] == 5
    assert record["digests"] == field_digests(
        Transforms(5, chains=_transforms(loader).chains, sample_calls=(joint,))
    )
    assert [c["call"] for c in record["fields"]["image"]] == ["prep:invert"]  # type: ignore[index]
    assert record["sample"] == [{"fields": ["image", "mask"], **identity_of(joint.call).as_json()}]
