"""One writer per output directory: an export or a training run holds a lock on it while it writes.

The lock is the operating system's (``flock``) on a file beside the directory, so a killed holder leaves no lock,
only the file, which the next writer takes over. A second writer is refused at once, in one line naming the first.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from edgecap.errors import EdgecapError


def lock_file(directory: Path) -> Path:
    """``.NAME.lock`` beside ``directory``: the directory itself may not exist yet, or be swapped for a new one."""
    return directory.parent / f".{directory.name}.lock"


@contextmanager
def writing(directory: Path, what: str) -> Iterator[None]:
    """Hold ``directory``'s lock for the block, or refuse because another process holds it."""
    try:
        import fcntl
    except ImportError:  # Windows: no advisory locks, so concurrent writers are not refused there
        yield
        return
    path = lock_file(directory)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            # The file the lock was taken on must still be the lock file: its last holder unlinks it on leaving.
            if not path.exists() or os.stat(path).st_ino != os.fstat(handle.fileno()).st_ino:
                raise BlockingIOError
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            raise EdgecapError(f"{directory}: {holder} is writing it; wait for it to end or choose another "
                               "output directory") from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"{what} (pid {os.getpid()})")
        handle.flush()
        try:
            yield
        finally:
            path.unlink(missing_ok=True)
            fcntl.flock(handle, fcntl.LOCK_UN)
