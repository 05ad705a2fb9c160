"""Open a file inside a directory without following links out of it.

    fd = open_inside(root, "checkpoints/00000010.safetensors")

Walks the path one component at a time from a descriptor of `root` (openat with O_NOFOLLOW), so no
component below root can be a symbolic link, and a link swapped in between a check and the open
is refused too (no check-then-use race). The file itself must be a regular file (a FIFO would
block, a device would never end); it is opened with O_NONBLOCK so that a FIFO is refused, not
waited on. Root itself is the verifier's choice and may be a link; or it is a descriptor the caller opened
(`open_directory_no_links`: a path the caller resolved and checked, no link anywhere along it). Reasons name only
the path inside root: never the target of a link or anything read from outside.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

CLOEXEC = getattr(os, "O_CLOEXEC", 0)
NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
# a folder walked through, not read: search permission is enough, as for any path lookup (a prover's home folder of
# mode 0711); O_RDONLY where a platform has no O_PATH
WALK = getattr(os, "O_PATH", os.O_RDONLY) | os.O_DIRECTORY | NOFOLLOW | CLOEXEC


class Refused(Exception):
    """The path does not name a regular file inside root; the message names only the relative path. transient: it is
    missing or unreadable (a share's hiccup, which a copy retries), not a link, a device or a folder in its place (the
    prover's doing)."""

    def __init__(self, message: str, transient: bool = False):
        super().__init__(message)
        self.transient = transient


def _why(dfd: int, part: str, rel: str, err: OSError, at: str | None = None) -> Refused:
    """Why rel could not be opened at its component `part` (`at`: the path down to that component, where it is a
    folder above rel: the link it is, not rel, is named)."""
    try:
        st = os.lstat(part, dir_fd=dfd)
    except OSError:
        return Refused(f"{rel}: missing", transient=True)
    if stat.S_ISLNK(st.st_mode):
        link = "a symbolic link" if at is None else f"{at} is a symbolic link"
        return Refused(f"{rel}: {link} (transcript files must be regular files inside the transcript)")
    special = (
        stat.S_ISSOCK(st.st_mode) or stat.S_ISFIFO(st.st_mode) or stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)
    )
    if err.errno in (errno.ENOTDIR, errno.ELOOP) or special:  # (a socket is ENXIO: no share's hiccup either)
        return Refused(f"{rel}: not a regular file inside the transcript")
    return Refused(f"{rel}: not readable ({errno.errorcode.get(err.errno, 'error')})", transient=True)


def open_directory_no_links(path: Path) -> int:
    """A descriptor of the directory at the absolute `path`, each of its components opened without following a link:
    a path the caller resolved and checked (a worker's, inside TRANSCRIPT_ROOTS) reached as checked, where a link a
    prover swapped in after the check, anywhere along it, had been followed out of the roots. Raises Refused: "...
    reached through a symbolic link or a file" where one is along it (the prover's doing), else ending ": missing"
    or ": not readable (...)" (a share's hiccup, as a missing or unreadable file is)."""
    path = Path(path)
    if not path.is_absolute():
        raise Refused("the transcript directory: not an absolute path", transient=True)  # (the caller's, not a verdict)
    dfd = os.open("/", WALK)
    try:
        for part in path.parts[1:]:
            try:
                nfd = os.open(part, WALK, dir_fd=dfd)
            except OSError as e:
                raise _why_not_walked(dfd, part, e) from None
            os.close(dfd)
            dfd = nfd
    except BaseException:
        os.close(dfd)
        raise
    return dfd


def _why_not_walked(dfd: int, part: str, err: OSError) -> Refused:
    """Why the walk stopped at `part`: a link or a file there (malformed), or it is gone or unreadable (retried)."""
    try:
        st = os.lstat(part, dir_fd=dfd)
    except OSError:
        return Refused("the transcript directory: missing", transient=True)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        return Refused("the transcript directory is reached through a symbolic link or a file")
    return Refused(
        f"the transcript directory: not readable ({errno.errorcode.get(err.errno, 'error')})", transient=True
    )


def open_inside(root: Path | int, rel: str) -> int:
    """A read-only descriptor of the regular file root/rel (root a path, or a directory descriptor the caller keeps
    open); raises Refused."""
    parts = rel.split("/")
    if not rel or any(p in ("", ".", "..") for p in parts):
        raise Refused(f"{rel}: not a plain path inside the transcript")
    try:
        # (walked through, not read: search permission is enough, as for WALK; root itself may be a link here)
        dfd = os.dup(root) if isinstance(root, int) else os.open(root, WALK & ~NOFOLLOW)
    except OSError:
        raise Refused("the transcript directory is missing or not a directory") from None
    try:
        for depth, part in enumerate(parts[:-1]):
            try:
                nfd = os.open(part, WALK, dir_fd=dfd)  # (a 0711 checkpoints/ folder: searched, not read)
            except OSError as e:
                raise _why(dfd, part, rel, e, "/".join(parts[: depth + 1])) from None
            os.close(dfd)
            dfd = nfd
        try:
            fd = os.open(parts[-1], os.O_RDONLY | NOFOLLOW | os.O_NONBLOCK | CLOEXEC, dir_fd=dfd)
        except OSError as e:
            raise _why(dfd, parts[-1], rel, e) from None
    finally:
        os.close(dfd)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise Refused(f"{rel}: not a regular file")
    return fd
