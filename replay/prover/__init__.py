"""The prover's simulation: the recorder that writes a transcript and the simulated chips that log signed snapshots."""

LISTED = 8  # serials a message names before it counts the rest


def listed(names, most: int = LISTED) -> str:
    """names joined with ", ", the first `most` of them and then how many more: a message about 4,096 chips stays a
    line, not 40 KB of serials."""
    names = list(names)
    if len(names) <= most:
        return ", ".join(names)
    return f"{', '.join(names[:most])} and {len(names) - most:,} more"
