"""Safe file helpers for folders that hold conversations: the warm tier's model folders and the
stored responses. A write is atomic and durable (temp file, fsync, rename, fsync the folder), a
read opens only a regular file and never through a link, a delete removes only a regular file,
and a listing stats entries without following them. No MLX here.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
import sys
from collections.abc import Iterable
from pathlib import Path

TEMP_SUFFIX = ".tmp"  # an interrupted write leaves `.<name>.<random>.tmp` behind


class NotRegularFile(ValueError):
    """Something other than a regular file (a FIFO, a device, a folder) stands at the path."""


def open_regular(path: Path):
    """Open a file for reading only if it is a regular file: never through a symbolic link,
    never a FIFO or a device (O_NONBLOCK keeps a FIFO from hanging the open itself)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotRegularFile("not a regular file")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def open_dir(path: Path, *, follow: bool = True) -> int:
    """A folder's descriptor, for *at() calls. follow=False refuses a link as the folder itself
    (ELOOP); anything but a folder, a FIFO included, is refused unopened (ENOTDIR)."""
    flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NONBLOCK", 0)
    if not follow:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    return os.open(path, flags)


def write_atomic(path: Path, chunks: Iterable[bytes], *, follow_parent: bool = False) -> int:
    """Temp file in the same folder, fsync, rename, fsync the folder: old or new, never partial.
    The folder is opened once and everything happens in it: unless follow_parent, a link
    planted as the folder is refused (ELOOP) rather than written through."""
    dir_fd = open_dir(path.parent, follow=follow_parent)
    try:
        tmp = f".{path.name}.{secrets.token_hex(4)}{TEMP_SUFFIX}"
        written = 0
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600, dir_fd=dir_fd)
        try:
            try:
                for chunk in chunks:
                    view = memoryview(chunk)
                    while view:
                        n = os.write(fd, view)
                        if n <= 0:
                            raise OSError(errno.EIO, "short write")
                        view, written = view[n:], written + n
                _full_fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, path.name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=dir_fd)
            except FileNotFoundError:
                pass
            raise
        _full_fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return written


def _full_fsync(fd: int) -> None:
    if sys.platform == "darwin":
        import fcntl

        fcntl.fcntl(fd, fcntl.F_FULLFSYNC)
    else:
        os.fsync(fd)


def unlink_regular(path: Path, *, follow_parent: bool = False) -> bool:
    """Delete a file we wrote; never a link's target, never a folder or a FIFO, never through
    a link planted as its folder (unless follow_parent). False if it was not there (or not ours)."""
    try:
        dir_fd = open_dir(path.parent, follow=follow_parent)
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError as e:
        if e.errno == errno.ELOOP:  # the folder is a link
            return False
        raise
    try:
        if not stat.S_ISREG(os.stat(path.name, dir_fd=dir_fd, follow_symlinks=False).st_mode):
            return False
        os.unlink(path.name, dir_fd=dir_fd)
    except FileNotFoundError:
        return False
    finally:
        os.close(dir_fd)
    return True


def entries(folder: Path) -> list[tuple[os.DirEntry, os.stat_result]]:
    """A folder's entries with their own (not followed) stat; none if it is not a real folder or
    vanishes meanwhile (another process may prune the cache while we list it)."""
    try:
        if not stat.S_ISDIR(os.lstat(folder).st_mode):
            return []
        with os.scandir(folder) as it:
            listed = list(it)
    except (FileNotFoundError, NotADirectoryError):
        return []
    out = []
    for entry in sorted(listed, key=lambda e: e.name):
        try:
            out.append((entry, entry.stat(follow_symlinks=False)))
        except FileNotFoundError:
            continue
    return out
