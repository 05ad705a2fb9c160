"""C2SP tlog-tiles, the pure part (tlog/tiles.py): path encoding and parsing, entry bundles, geometry.
Properties with hypothesis; the spec's own examples."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tlog import tiles


def test_index_encoding_follows_the_spec_example():
    assert tiles.encode_index(1234067) == "x001/x234/067"
    assert tiles.encode_index(0) == "000" and tiles.encode_index(1000) == "x001/000"
    assert tiles.tile_path(2, 5, 17) == "tile/2/005.p/17"
    assert tiles.bundle_path(1234067) == "tile/entries/x001/x234/067"


@given(
    level=st.none() | st.integers(0, 63),
    index=st.integers(0, 2**64),
    width=st.none() | st.integers(1, 255),
)
def test_paths_round_trip(level, index, width):
    path = tiles.bundle_path(index, width) if level is None else tiles.tile_path(level, index, width)
    assert tiles.parse_path(path) == (level, index, width)


@pytest.mark.parametrize(
    "path",
    [
        "tile/0/1",  # not padded
        "tile/0/0001",
        "tile/0/x000/001",  # a leading zero group: 1 has one name
        "tile/00/001",
        "tile/64/001",  # level 0..63
        "tile/0/001.p/0",
        "tile/0/001.p/256",
        "tile/0/001.p/07",
        "tile/0/001/",
        "tile/0/001\n",
        "tile/-1/001",
        "tile/entries/x1/001",
        "tile/0/x001",
        "tile/0/０01",  # fullwidth digit
        "tile/0/001.p/",
        "tile/data/001",
    ],
)
def test_non_canonical_paths_are_refused(path):
    with pytest.raises(tiles.TilePathError):
        tiles.parse_path(path)


@given(st.lists(st.binary(max_size=300), max_size=256))
def test_bundles_round_trip(entries):
    assert tiles.decode_bundle(tiles.encode_bundle(entries)) == entries


@given(st.lists(st.binary(min_size=1, max_size=40), min_size=1, max_size=5), st.data())
def test_a_truncated_bundle_is_refused(entries, data):
    bundle = tiles.encode_bundle(entries)
    cut = data.draw(st.integers(1, len(bundle) - 1))
    try:
        decoded = tiles.decode_bundle(bundle[:-cut])
    except ValueError:
        return
    assert len(decoded) < len(entries)  # cut at an entry's boundary: a shorter bundle, which its tile refutes


def test_an_entry_over_65535_bytes_cannot_be_bundled():
    tiles.encode_bundle([b"x" * 65_535])
    with pytest.raises(ValueError, match="65535"):
        tiles.encode_bundle([b"x" * 65_536])


def test_geometry_follows_the_spec_example_of_70000():
    found = list(tiles.tiles_for_size(70_000))
    assert [t for t in found if t[0] == 0 and t[2] is None] == [(0, i, None) for i in range(273)]
    assert (0, 273, 112) in found and (1, 0, None) in found and (1, 1, 17) in found and (2, 0, 1) in found
    assert len(found) == 273 + 1 + 1 + 1 + 1
    assert list(tiles.tiles_for_size(256)) == [(0, 0, None), (1, 0, 1)]
    assert list(tiles.bundles_for_size(300)) == [(0, None), (1, 44)]


@given(st.integers(0, 2**40), st.integers(0, 5), st.integers(0, 2**20))
def test_tile_width_is_what_the_tree_has_at_that_level(size, level, index):
    width = tiles.tile_width(size, level, index)
    listed = {(lv, i): w for lv, i, w in tiles.tiles_for_size(size)} if size < 70_000 else None
    assert 0 <= width <= 256
    assert width == max(0, min(256, (size >> 8 * level) - 256 * index))
    if listed is not None:
        expected = listed.get((level, index), 0)
        assert width == (256 if expected is None else expected)
