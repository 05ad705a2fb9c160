"""C2SP tlog-tiles: tile paths, tile geometry and entry bundles. Pure functions, no Django.

A tile at level L, index N holds up to 256 consecutive hashes of the tree's level 8L: hash i is the
root of the perfect subtree over leaves [(256N + i) << 8L, (256N + i + 1) << 8L), i.e. our node id
(8L, 256N + i) (``tlog.merkle``). Level-0 tiles hold leaf hashes; ``tile/entries/N`` holds the
leaves themselves, each prefixed by its big-endian uint16 length. A *partial* tile ``.p/W`` holds
the first W (1..255) hashes of a tile the tree has not completed.

Index paths are zero-padded 3-digit elements, every one but the last prefixed by ``x``:
1234067 -> ``x001/x234/067``.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator

TILE_HEIGHT = 8
TILE_WIDTH = 1 << TILE_HEIGHT  # 256 hashes
HASH_SIZE = 32
MAX_LEVEL = 63
MAX_ENTRY_BYTES = 0xFFFF  # an entry's length is a uint16
ENTRIES = "entries"
_sha256 = hashlib.sha256


class TilePathError(ValueError):
    """Not a tile path of C2SP tlog-tiles."""


def encode_index(index: int) -> str:
    if index < 0:
        raise ValueError(f"tile index must be non-negative, not {index}")
    groups = []
    while True:
        groups.append(f"{index % 1000:03d}")
        index //= 1000
        if index == 0:
            break
    groups.reverse()
    return "/".join([f"x{group}" for group in groups[:-1]] + [groups[-1]])


def _width_suffix(width: int | None) -> str:
    if width is None:
        return ""
    if not 1 <= width < TILE_WIDTH:
        raise ValueError(f"a partial tile's width is 1..255, not {width}")
    return f".p/{width}"


def tile_path(level: int, index: int, width: int | None = None) -> str:
    """``tile/<L>/<N>[.p/<W>]``; width None is a full tile."""
    if not 0 <= level <= MAX_LEVEL:
        raise ValueError(f"tile level is 0..63, not {level}")
    return f"tile/{level}/{encode_index(index)}{_width_suffix(width)}"


def bundle_path(index: int, width: int | None = None) -> str:
    """``tile/entries/<N>[.p/<W>]``."""
    return f"tile/{ENTRIES}/{encode_index(index)}{_width_suffix(width)}"


_LEVEL = r"(?P<level>0|[1-9][0-9]?|entries)"
_INDEX = r"(?P<index>(?:x[0-9]{3}/){0,6}[0-9]{3})"  # at most 21 digits: every uint64 index, never a giant int
_WIDTH = r"(?:\.p/(?P<width>[1-9][0-9]{0,2}))?"
_TILE_PATH = re.compile(rf"tile/{_LEVEL}/{_INDEX}{_WIDTH}")


def parse_path(path: str) -> tuple[int | None, int, int | None]:
    """``(level, index, width)`` of a tile path (level None for an entry bundle; width None if full).

    Strict: exactly the encoding ``tile_path``/``bundle_path`` produce, so one resource has one name
    (no leading zeros beyond the padding, no ``x000/`` prefixes, level 0..63, width 1..255).
    """
    match = _TILE_PATH.fullmatch(path)
    if match is None:
        raise TilePathError(f"not a tile path: {path[:200]!r}")
    level_text, index_text, width_text = match.group("level", "index", "width")
    level = None if level_text == ENTRIES else int(level_text)
    if level is not None and level > MAX_LEVEL:
        raise TilePathError(f"tile level is 0..63, not {level}")
    if index_text.startswith("x000/"):
        raise TilePathError("tile index has a leading zero group")
    index = int(index_text.replace("x", "").replace("/", ""))
    width = None if width_text is None else int(width_text)
    if width is not None and width >= TILE_WIDTH:
        raise TilePathError(f"a partial tile's width is 1..255, not {width}")
    return level, index, width


# --- geometry -------------------------------------------------------------------


def hashes_at_level(size: int, level: int) -> int:
    """How many complete hashes a tree of ``size`` leaves has at tile level ``level`` (tree level 8L)."""
    return size >> (TILE_HEIGHT * level)


def tile_width(size: int, level: int, index: int) -> int:
    """How many hashes tile (level, index) holds in a tree of ``size`` leaves: 256 full, 0 if it does not exist."""
    available = hashes_at_level(size, level) - index * TILE_WIDTH
    return max(0, min(TILE_WIDTH, available))


def node_range(level: int, index: int, width: int) -> tuple[int, int, int]:
    """The tree level and the [first, end) node indices at that level that tile (level, index) of ``width`` holds."""
    first = index * TILE_WIDTH
    return TILE_HEIGHT * level, first, first + width


def tiles_for_size(size: int) -> Iterator[tuple[int, int, int | None]]:
    """Every tile ``(level, index, width or None if full)`` of a tree of ``size`` leaves, level by level."""
    level = 0
    while hashes_at_level(size, level):
        count = hashes_at_level(size, level)
        for index in range(count // TILE_WIDTH):
            yield level, index, None
        if count % TILE_WIDTH:
            yield level, count // TILE_WIDTH, count % TILE_WIDTH
        level += 1


def bundles_for_size(size: int) -> Iterator[tuple[int, int | None]]:
    """Every entry bundle ``(index, width or None if full)`` of a tree of ``size`` leaves."""
    for index in range(size // TILE_WIDTH):
        yield index, None
    if size % TILE_WIDTH:
        yield size // TILE_WIDTH, size % TILE_WIDTH


# --- content --------------------------------------------------------------------


def encode_bundle(entries: list[bytes]) -> bytes:
    """Entries, each prefixed by its big-endian uint16 length."""
    parts = []
    for number, entry in enumerate(entries):
        if len(entry) > MAX_ENTRY_BYTES:
            raise ValueError(f"entry {number} is {len(entry)} bytes; a tlog-tiles entry is at most {MAX_ENTRY_BYTES}")
        parts.append(len(entry).to_bytes(2, "big"))
        parts.append(entry)
    return b"".join(parts)


def decode_bundle(data: bytes) -> list[bytes]:
    """The entries of a bundle; raises ValueError if it does not split exactly, or holds more than 256."""
    entries: list[bytes] = []
    append, position, end = entries.append, 0, len(data)
    while position < end:  # the outside verifier's hot loop: kept tight
        start = position + 2
        if start > end:
            raise ValueError("entry bundle ends inside a length prefix")
        position = start + (data[start - 2] << 8 | data[start - 1])
        if position > end:
            raise ValueError(f"entry bundle's entry {len(entries)} runs past its end")
        append(data[start:position])
    if len(entries) > TILE_WIDTH:
        raise ValueError("entry bundle holds more than 256 entries")
    return entries


def split_tile(data: bytes) -> list[bytes]:
    """The hashes of a tile's bytes; raises ValueError unless it is 1..256 whole hashes."""
    if not data or len(data) % HASH_SIZE or len(data) > TILE_WIDTH * HASH_SIZE:
        raise ValueError(f"a tile is 1 to 256 hashes of 32 bytes, not {len(data)} bytes")
    return [data[i : i + HASH_SIZE] for i in range(0, len(data), HASH_SIZE)]


# --- checking served tiles ------------------------------------------------------------
# A row of hashes is kept as one bytes object (32 bytes each), never as a list of 32-byte objects: a tile
# is compared with one ``==``, and each level up is one list comprehension over 64-byte slices. The audit
# is bound by CPython's cost per SHA-256 call, so nothing else is done per hash.


def leaf_hashes(leaves: list[bytes]) -> bytes:
    """The RFC 9162 leaf hashes of ``leaves``, joined."""
    return b"".join([_sha256(b"\x00" + leaf).digest() for leaf in leaves])


def perfect_root(row: bytes) -> bytes:
    """The root of a perfect subtree whose bottom row is ``row``: a power of two of joined 32-byte hashes."""
    while len(row) > HASH_SIZE:
        row = b"".join([_sha256(b"\x01" + row[i : i + 2 * HASH_SIZE]).digest() for i in range(0, len(row), 64)])
    return row


class TileMismatch(ValueError):
    """A served tile differs from the hashes recomputed from the entries (``first_leaf``: where it starts)."""

    def __init__(self, path: str, first_leaf: int, position: int):
        super().__init__(f"{path} differs from the entries' hashes at its hash {position}")
        self.path, self.first_leaf, self.position = path, first_leaf, position

    def __reduce__(self):  # raised in a worker process, re-raised by the parent
        return type(self), (self.path, self.first_leaf, self.position)


def check_tile(read_tile, level: int, index: int, width: int | None, row: bytes) -> None:
    """Raise TileMismatch unless ``read_tile(level, index, width)`` is exactly ``row`` (joined hashes)."""
    served = read_tile(level, index, width)
    if served == row:
        return
    position = next(
        (i for i in range(len(row) // HASH_SIZE) if served[32 * i : 32 * i + 32] != row[32 * i : 32 * i + 32]),
        0,
    )
    first_leaf = (index * TILE_WIDTH + position) << (TILE_HEIGHT * level)
    raise TileMismatch(tile_path(level, index, width), first_leaf, position)


class TileAuditor:
    """Checks every hash tile of a tree against the leaf hashes of its entry bundles, fed in order.

    ``read_tile(level, index, width)`` returns the served bytes. ``add_bundle`` checks the bundle's level-0
    tile at once (so a bad leaf is named where it is) and ``add_root`` takes the root of a full bundle whose
    level-0 tile was checked elsewhere (a worker process); each full bundle's root goes up to level 1, and
    a tile above level 0 is checked when its 256 hashes are known. ``finish()`` checks the right edge above
    level 0. Cost: one SHA-256 per hash above level 0, i.e. about one per leaf.
    """

    def __init__(self, read_tile):
        self.read_tile = read_tile
        self.pending: list[list[bytes]] = [[]]  # per level, the hashes of the tile being filled
        self.done: list[int] = [0]  # full tiles checked per level
        self.tiles_checked = 0

    def add_bundle(self, index: int, leaf_hashes: bytes) -> bytes | None:
        """Check bundle ``index``'s level-0 tile (its joined leaf hashes); returns its root if it is full."""
        full = len(leaf_hashes) == TILE_WIDTH * HASH_SIZE
        check_tile(self.read_tile, 0, index, None if full else len(leaf_hashes) // HASH_SIZE, leaf_hashes)
        self.tiles_checked += 1
        if not full:
            return None
        root = perfect_root(leaf_hashes)
        self.add_root(root)
        return root

    def add_root(self, root: bytes) -> None:
        """The root of the next full bundle, whose level-0 tile is already checked."""
        self._push(1, root)

    def _push(self, level: int, digest: bytes) -> None:
        while len(self.pending) <= level:
            self.pending.append([])
            self.done.append(0)
        hashes = self.pending[level]
        hashes.append(digest)
        if len(hashes) == TILE_WIDTH:
            row = b"".join(hashes)
            self._check(level, self.done[level], None, row)
            self.pending[level] = []
            self.done[level] += 1
            self._push(level + 1, perfect_root(row))

    def _check(self, level: int, index: int, width: int | None, row: bytes) -> None:
        check_tile(self.read_tile, level, index, width, row)
        self.tiles_checked += 1

    def finish(self) -> None:
        for level, hashes in enumerate(self.pending):
            if level and hashes:
                self._check(level, self.done[level], len(hashes), b"".join(hashes))
