"""Reads of the C2SP tlog-tiles view of the ledger (docs/ledger.md, Tiles): one range query per tile.

Nothing is recomputed per request and nothing extra is stored: a level-L tile is 256 consecutive
hashes of tree level 8L, which the tree already keeps (``Entry.hash`` at level 0, ``TreeNode`` rows
above), and an entry bundle is 256 consecutive leaves. Both are written as entries are appended
(``ledger.services.append_entries``), in the append's transaction.
"""

from __future__ import annotations

from django.db import connection

from tlog import tiles


def tile(level: int, index: int, width: int | None) -> bytes | None:
    """The bytes of tile ``tile/<level>/<index>[.p/<width>]``, or None if the tree has not that many hashes there.

    A partial width the tree has outgrown is still served (its first ``width`` hashes): those never change.
    """
    count = width or tiles.TILE_WIDTH
    tree_level, first, end = tiles.node_range(level, index, count)
    with connection.cursor() as cursor:
        if tree_level == 0:
            cursor.execute("SELECT hash FROM ledger_entry WHERE seq >= %s AND seq < %s ORDER BY seq", [first, end])
        else:
            cursor.execute(
                'SELECT hash FROM ledger_treenode WHERE level = %s AND "index" >= %s AND "index" < %s ORDER BY "index"',
                [tree_level, first, end],
            )
        rows = cursor.fetchall()
    if len(rows) != count:
        return None
    return b"".join(bytes(digest) for (digest,) in rows)


def entry_bundle(index: int, width: int | None) -> bytes | None:
    """The bytes of ``tile/entries/<index>[.p/<width>]``: the leaves, each prefixed by its uint16 length."""
    count = width or tiles.TILE_WIDTH
    first = index * tiles.TILE_WIDTH
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT leaf FROM ledger_entry WHERE seq >= %s AND seq < %s ORDER BY seq", [first, first + count]
        )
        rows = cursor.fetchall()
    if len(rows) != count:
        return None
    return tiles.encode_bundle([bytes(leaf) for (leaf,) in rows])
