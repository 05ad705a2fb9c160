"""Factories for ledger data: entries appended through the real service."""

from __future__ import annotations

from ledger import services


def append_sample_entries(count: int, kind: str = "test.sample", actor: str = "vendor-a") -> list:
    """Append ``count`` entries with varied payloads in one batch."""
    batch = [
        services.NewEntry(kind, {"n": n, "serial": f"SN-{n:06d}", "tags": ["a", "ü", n % 3], "ok": n % 2 == 0}, actor)
        for n in range(count)
    ]
    return services.append_entries(batch)
