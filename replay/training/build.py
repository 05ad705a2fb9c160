"""Shared libraries built from this package's sources on first use (the kernel, the step allocator) and cached."""

from __future__ import annotations

import ctypes
import hashlib
import os
import shlex
import subprocess
import tempfile
import warnings
from pathlib import Path


def cache_dir() -> Path:
    """Where built libraries are kept: $REPLAY_NATIVE_CACHE, else chipledger-replay in the user's cache folder."""
    return Path(
        os.environ.get("REPLAY_NATIVE_CACHE")
        or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "chipledger-replay"
    )


def compiled(cc: str, source: Path, tries: list[list[str]], libs: list[str], name: str, salt: str) -> Path:
    """A shared library of `source` built with `cc` and the first flags in `tries` it takes (the last try's error
    raised), then `libs`; cached by source, compiler, first flags and salt (what else it depends on: the CPU, torch's
    version), written to a temporary name and renamed, so that concurrent first uses do not collide."""
    src = source.read_bytes()
    key = hashlib.sha256(src + cc.encode() + " ".join(tries[0] + libs).encode() + salt.encode()).hexdigest()[:16]
    cache = cache_dir()
    lib = cache / f"{name}-{key}.so"
    if lib.exists():
        return lib
    cache.mkdir(mode=0o700, parents=True, exist_ok=True)  # private: a library loaded from here runs in-process
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=cache)
    os.close(fd)
    try:
        for n, args in enumerate(tries):
            try:
                command = [*shlex.split(cc), *args, "-o", tmp, str(source), *libs]  # $CC may be "ccache gcc"
                subprocess.run(command, check=True, capture_output=True, timeout=120)
                break
            except subprocess.CalledProcessError:
                if n == len(tries) - 1:
                    raise
        os.replace(tmp, lib)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return lib


def loaded(switch: str, built, unavailable: str):
    """The library `built()` returns, loaded; False where the environment variable `switch` is "0", or where it cannot
    be built or loaded (warned: `unavailable`, then why)."""
    if os.environ.get(switch, "1") == "0":
        return False
    try:
        return ctypes.CDLL(str(built()))
    except (OSError, subprocess.SubprocessError) as exc:
        detail = getattr(exc, "stderr", b"") or b""
        warnings.warn(f"replay: {unavailable} ({exc} {detail[-300:]!r})", RuntimeWarning, stacklevel=4)
        return False
