"""SFTP on a kept connection, in bytes: names and paths are what the cluster's file system holds
(any byte but NUL and '/'), never decoded, so a name that is no UTF-8 lists, reads and goes away
like any other. paramiko decodes names as UTF-8 (and fails on the rest), so listing and
resolving read the protocol's strings themselves; paths it takes as bytes already.

Reads and writes are pipelined with a bounded number of requests in flight: paramiko's own
prefetch asks for a whole file at once and holds whatever arrives until it is read, which for a
slow reader is the whole file in memory. Everything here blocks: callers on an event loop run it
in threads, one call at a time per session.
"""

from __future__ import annotations

import errno
import stat
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import paramiko
from paramiko.message import Message
from paramiko.sftp import (
    CMD_ATTRS,
    CMD_CLOSE,
    CMD_DATA,
    CMD_EXTENDED,
    CMD_EXTENDED_REPLY,
    CMD_FSTAT,
    CMD_HANDLE,
    CMD_INIT,
    CMD_LSTAT,
    CMD_MKDIR,
    CMD_NAME,
    CMD_OPEN,
    CMD_OPENDIR,
    CMD_READ,
    CMD_READDIR,
    CMD_REALPATH,
    CMD_REMOVE,
    CMD_RENAME,
    CMD_RMDIR,
    CMD_STAT,
    CMD_STATUS,
    CMD_VERSION,
    CMD_WRITE,
    SFTP_FLAG_CREATE,
    SFTP_FLAG_EXCL,
    SFTP_FLAG_READ,
    SFTP_FLAG_TRUNC,
    SFTP_FLAG_WRITE,
    SFTPError,
    int64,
)
from paramiko.sftp_attr import SFTPAttributes

from core.transport.chunk_pipe import ChunkPipe
from core.transport.errors import SSHError
from core.transport.heap import keep_transfer_buffers

# What every server takes (the protocol's draft asks for 32768-byte reads and writes at least);
# OpenSSH says it takes more through its limits@openssh.com extension.
SAFE_REQUEST = 32768
# The largest read or write asked for at once, and how many are in flight per transfer: about
# the 2 MiB OpenSSH's sftp keeps in flight. With paramiko's own channel buffer more reads ahead
# were slower (it moved what it still held on every read); the ChunkPipe does not, and 8, 16 and
# 32 in flight measured the same on loopback (alternating, 1 GiB: 430-480 MB/s each), so 8
# keeps the memory.
LARGEST_REQUEST = 256 * 1024
READS_IN_FLIGHT = 8
WRITES_IN_FLIGHT = 16


class FileError(SSHError):
    """The cluster refused a file operation (the connection itself is fine)."""


class NoSuchFile(FileError):
    pass


class PermissionDenied(FileError):
    pass


class FileExists(FileError):
    pass


class NotEmpty(FileError):
    pass


class NotAFile(FileError):
    """A transfer named a folder or something else that is no regular file."""


class ShortFile(FileError):
    """The file ended before the size it had when it was opened."""


FILE, DIR, LINK, OTHER = "file", "dir", "link", "other"


@dataclass(frozen=True)
class FileStat:
    """One name in a folder (or a path's own attributes, ``name`` its last part)."""

    name: bytes
    kind: str  # FILE, DIR, LINK or OTHER
    size: int
    mtime: int | None
    mode: int  # permission bits only

    @classmethod
    def of(cls, name: bytes, attrs: SFTPAttributes) -> FileStat:
        mode = attrs.st_mode or 0
        if stat.S_ISLNK(mode):
            kind = LINK
        elif stat.S_ISDIR(mode):
            kind = DIR
        elif stat.S_ISREG(mode):
            kind = FILE
        else:
            kind = OTHER
        return cls(
            name=name,
            kind=kind,
            size=int(attrs.st_size or 0),
            mtime=int(attrs.st_mtime) if attrs.st_mtime is not None else None,
            mode=stat.S_IMODE(mode),
        )


def _attributes(message: Message) -> SFTPAttributes:
    # paramiko parses attributes only through this private constructor.
    parse: Any = SFTPAttributes
    attributes: SFTPAttributes = parse._from_msg(message)
    return attributes


def _refused(exc: BaseException, what: str) -> FileError:
    code = getattr(exc, "errno", None)
    text = (getattr(exc, "strerror", None) or str(exc) or type(exc).__name__).strip()
    if code == errno.ENOENT:
        return NoSuchFile(f"{what}: no such file or folder")
    if code == errno.EACCES:
        return PermissionDenied(f"{what}: permission denied by the cluster")
    return FileError(f"{what}: {text}")


class SFTPClient(paramiko.SFTPClient):
    """paramiko's client, keeping the extensions the server names in its version packet, its
    channel's incoming bytes in a ChunkPipe, and fewer copies of each packet made."""

    extensions: dict[bytes, bytes]

    def __init__(self, sock: paramiko.Channel) -> None:
        keep_transfer_buffers()
        # Before the first packet: the server says nothing until the client's version.
        channel: Any = sock
        held, channel.in_buffer = channel.in_buffer, ChunkPipe()
        channel.in_buffer.feed(held.empty())
        super().__init__(sock)

    def _write_all(self, out: bytes) -> None:
        # paramiko's slices what is left of ``out`` anew after each channel packet.
        view = memoryview(out)
        sock: Any = self.sock
        while view:
            sent = sock.send(view)
            if sent <= 0:
                raise EOFError()
            view = view[sent:]

    def _read_all(self, n: int) -> bytes:
        parts: list[bytes] = []
        sock: Any = self.sock
        while n > 0:
            piece = sock.recv(n)
            if not piece:
                raise EOFError()
            parts.append(piece)
            n -= len(piece)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def _read_packet(self) -> tuple[int, bytes]:
        # The kind apart from the rest, so the rest is not copied to drop its first byte.
        head = self._read_all(4)
        if head[0]:
            raise SFTPError("Garbage packet received")
        size = int.from_bytes(head, "big")
        if not size:
            return 0, b""
        kind = self._read_all(1)[0]
        return kind, self._read_all(size - 1) if size > 1 else b""

    def _send_version(self) -> int:
        message = Message()
        message.add_int(3)
        base: Any = self  # paramiko's private packet methods are untyped
        base._send_packet(CMD_INIT, message)
        kind, data = base._read_packet()
        if kind != CMD_VERSION:
            raise SFTPError("Incompatible sftp protocol")
        reply = Message(data)
        version = int(reply.get_int())
        self.extensions = {}
        while reply.get_remainder():
            name, value = reply.get_string(), reply.get_string()
            self.extensions[name] = value
        return version


class _Responses:
    """Where paramiko hands the answers to requests sent ahead (by their number)."""

    def __init__(self) -> None:
        self.answers: dict[int, tuple[int, Message]] = {}

    def _async_response(self, kind: int, message: Message, number: int) -> None:
        self.answers[number] = (kind, message)


class SFTPSession:
    """One SFTP session on a channel of its own; ``close`` gives the channel back."""

    def __init__(self, client: SFTPClient, on_close: Callable[[], None]) -> None:
        # Typed loosely: the requests below are paramiko's private methods.
        self._client: Any = client
        self._on_close: Callable[[], None] | None = on_close
        self.read_size, self.write_size = SAFE_REQUEST, SAFE_REQUEST
        if b"limits@openssh.com" in client.extensions:
            self._ask_limits()

    def __enter__(self) -> SFTPSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        on_close, self._on_close = self._on_close, None
        if on_close is None:
            return
        try:
            self._client.close()
        finally:
            on_close()

    # -- requests ---------------------------------------------------------------------------

    def _request(self, what: str, kind: int, *args: Any) -> tuple[int, Message]:
        try:
            answer: tuple[int, Message] = self._client._request(kind, *args)
            return answer
        except OSError as exc:
            if isinstance(exc, TimeoutError):
                raise SSHError(f"{what}: the cluster did not answer in time") from None
            raise _refused(exc, what) from None
        except EOFError:
            raise NoSuchFile(f"{what}: end of file") from None
        except (paramiko.SSHException, SFTPError) as exc:
            raise SSHError(f"{what}: the SFTP session failed: {exc}") from None

    def _ask_limits(self) -> None:
        try:
            kind, reply = self._client._request(CMD_EXTENDED, "limits@openssh.com")
        except (OSError, EOFError):
            return
        if kind != CMD_EXTENDED_REPLY:
            return
        _, read_length, write_length = (reply.get_int64() for _ in range(3))
        if read_length:
            self.read_size = max(SAFE_REQUEST, min(LARGEST_REQUEST, read_length))
        if write_length:
            self.write_size = max(SAFE_REQUEST, min(LARGEST_REQUEST, write_length))

    # -- names ------------------------------------------------------------------------------

    def realpath(self, path: bytes) -> bytes:
        """The absolute path the server makes of ``path`` ("." is the login's home)."""
        kind, message = self._request("resolving a path", CMD_REALPATH, path)
        if kind != CMD_NAME or message.get_int() != 1:
            raise SSHError("resolving a path: the server answered out of protocol")
        return bytes(message.get_string())

    def stat(self, path: bytes) -> FileStat:
        return self._stat(CMD_STAT, path)

    def lstat(self, path: bytes) -> FileStat:
        return self._stat(CMD_LSTAT, path)

    def exists(self, path: bytes) -> bool:
        try:
            self.lstat(path)
        except NoSuchFile:
            return False
        return True

    def _stat(self, kind: int, path: bytes) -> FileStat:
        answer, message = self._request("reading a file's attributes", kind, path)
        if answer != CMD_ATTRS:
            raise SSHError("reading attributes: the server answered out of protocol")
        return FileStat.of(path.rstrip(b"/").rsplit(b"/", 1)[-1], _attributes(message))

    def listdir(self, path: bytes) -> list[FileStat]:
        """A folder's names with their own attributes (a link's, not its target's); no . or .."""
        kind, message = self._request("opening a folder", CMD_OPENDIR, path)
        if kind != CMD_HANDLE:
            raise SSHError("opening a folder: the server answered out of protocol")
        handle = message.get_string()
        entries: list[FileStat] = []
        try:
            while True:
                try:
                    kind, message = self._client._request(CMD_READDIR, handle)
                except EOFError:
                    break
                except OSError as exc:
                    raise _refused(exc, "reading a folder") from None
                if kind != CMD_NAME:
                    raise SSHError("reading a folder: the server answered out of protocol")
                for _ in range(message.get_int()):
                    name = bytes(message.get_string())
                    message.get_string()  # the long name, as `ls -l` would show it
                    attrs = _attributes(message)
                    if name not in (b".", b".."):
                        entries.append(FileStat.of(name, attrs))
        finally:
            self._close_handle(handle)
        return entries

    # -- changes ----------------------------------------------------------------------------

    def mkdir(self, path: bytes) -> None:
        if self.exists(path):
            raise FileExists("making a folder: that name is taken")
        attrs = SFTPAttributes()
        attrs.st_mode = 0o777  # less the login's umask, as mkdir(1) would
        self._request("making a folder", CMD_MKDIR, path, attrs)

    def rename(self, source: bytes, target: bytes, *, replace: bool = False) -> None:
        """Rename; unless ``replace``, never over an existing name (OpenSSH links a file to its
        new name, which fails if it is taken, rather than renaming over it)."""
        if replace and b"posix-rename@openssh.com" in self._client.extensions:
            self._request("renaming", CMD_EXTENDED, "posix-rename@openssh.com", source, target)
            return
        if self.exists(target):
            if not replace:
                raise FileExists("renaming: the new name is taken")
            self.remove(target)
        try:
            self._request("renaming", CMD_RENAME, source, target)
        except FileError as exc:
            if type(exc) is FileError and self.exists(target):
                raise FileExists("renaming: the new name is taken") from None
            raise

    def remove(self, path: bytes) -> None:
        """Remove a file or a link (never what a link points to)."""
        self._request("deleting", CMD_REMOVE, path)

    def rmdir(self, path: bytes) -> None:
        try:
            self._request("deleting a folder", CMD_RMDIR, path)
        except FileError as exc:
            if type(exc) is FileError and self.listdir(path):
                raise NotEmpty("deleting a folder: it is not empty") from None
            raise

    def remove_tree(self, path: bytes) -> None:
        """Remove a folder and all it holds, depth first; links are removed, never followed."""
        pending = [(path, False)]
        while pending:
            folder, emptied = pending.pop()
            if emptied:
                self.rmdir(folder)
                continue
            pending.append((folder, True))
            for entry in self.listdir(folder):
                inner = folder.rstrip(b"/") + b"/" + entry.name
                if entry.kind == DIR:
                    pending.append((inner, False))
                else:
                    self.remove(inner)

    # -- transfers --------------------------------------------------------------------------

    def _open(self, path: bytes, flags: int, what: str) -> bytes:
        kind, message = self._request(what, CMD_OPEN, path, flags, SFTPAttributes())
        if kind != CMD_HANDLE:
            raise SSHError(f"{what}: the server answered out of protocol")
        return bytes(message.get_string())

    def _close_handle(self, handle: bytes) -> None:
        self._request("closing a file", CMD_CLOSE, handle)

    def open_reader(self, path: bytes) -> FileReader:
        handle = self._open(path, SFTP_FLAG_READ, "opening a file")
        try:
            kind, message = self._request("reading a file's attributes", CMD_FSTAT, handle)
            if kind != CMD_ATTRS:
                raise SSHError("reading attributes: the server answered out of protocol")
            attrs = FileStat.of(b"", _attributes(message))
            if attrs.kind != FILE:
                raise NotAFile("reading: that is not a file")
        except BaseException:
            self._close_handle(handle)
            raise
        return FileReader(self, handle, attrs.size)

    def open_writer(self, path: bytes) -> FileWriter:
        """A new file at ``path``; FileExists if the name is taken."""
        flags = SFTP_FLAG_WRITE | SFTP_FLAG_CREATE | SFTP_FLAG_EXCL | SFTP_FLAG_TRUNC
        try:
            handle = self._open(path, flags, "creating a file")
        except FileError as exc:
            if type(exc) is FileError and self.exists(path):
                raise FileExists("creating a file: that name is taken") from None
            raise
        return FileWriter(self, handle)


def _check_status(message: Message, what: str) -> None:
    code = message.get_int()
    text = message.get_string().decode("utf-8", "replace")
    if code == 0:
        return
    if code == 1:
        raise EOFError(text)
    exc = OSError({2: errno.ENOENT, 3: errno.EACCES}.get(code, 0), text)
    raise _refused(exc, what)


class _Pipeline:
    """Requests sent ahead on one session, answered in order."""

    def __init__(self, session: SFTPSession, handle: bytes) -> None:
        self.session = session
        self.client: Any = session._client
        self.handle = handle
        self.responses = _Responses()
        self.sent: deque[tuple[int, int, int]] = deque()  # (number, offset, length)
        self.closed = False

    def send(self, kind: int, *args: Any) -> int:
        try:
            return int(self.client._async_request(self.responses, kind, *args))
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise SSHError(f"the SFTP session failed: {exc}") from None

    def answer(self, number: int) -> tuple[int, Message]:
        try:
            while number not in self.responses.answers:
                self.client._read_response()
        except TimeoutError:
            raise SSHError("the cluster did not answer in time") from None
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise SSHError(f"the SFTP session failed: {exc}") from None
        return self.responses.answers.pop(number)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            while self.sent:
                self.answer(self.sent.popleft()[0])
        finally:
            self.session._close_handle(self.handle)


class FileReader(_Pipeline):
    """A file's bytes in order, ``size`` of them (its size when opened), a few reads ahead."""

    def __init__(self, session: SFTPSession, handle: bytes, size: int) -> None:
        super().__init__(session, handle)
        self.size = size
        self._asked = 0

    def _ask(self, offset: int, length: int) -> None:
        number = self.send(CMD_READ, self.handle, int64(offset), length)
        self.sent.append((number, offset, length))

    def chunks(self, chunk_size: int) -> Iterator[bytes]:
        """The file in pieces of about ``chunk_size`` bytes; ShortFile if it shrank."""
        request = self.session.read_size
        pieces: list[bytes] = []
        held = 0
        done = 0
        while done < self.size:
            while len(self.sent) < READS_IN_FLIGHT and self._asked < self.size:
                length = min(request, self.size - self._asked)
                self._ask(self._asked, length)
                self._asked += length
            number, offset, length = self.sent.popleft()
            data = self._data(number, offset)
            while len(data) < length:  # a short read: ask for the rest before going on
                more = self._read_now(offset + len(data), length - len(data))
                data += more
            done += len(data)
            pieces.append(data)
            held += len(data)
            if held >= chunk_size or done >= self.size:
                yield b"".join(pieces)
                pieces, held = [], 0

    def _data(self, number: int, offset: int) -> bytes:
        kind, message = self.answer(number)
        if kind == CMD_STATUS:
            try:
                _check_status(message, "reading a file")
            except EOFError:
                raise ShortFile("reading: the file shrank while it was read") from None
            raise SSHError("reading: the server answered out of protocol")
        if kind != CMD_DATA:
            raise SSHError("reading: the server answered out of protocol")
        return bytes(message.get_string())

    def _read_now(self, offset: int, length: int) -> bytes:
        number = self.send(CMD_READ, self.handle, int64(offset), length)
        return self._data(number, offset)


class FileWriter(_Pipeline):
    """Writes of the largest size the server takes, sent ahead, a bounded number in flight;
    ``close`` sends what is left and waits for every answer."""

    def __init__(self, session: SFTPSession, handle: bytes) -> None:
        super().__init__(session, handle)
        self.written = 0
        self._held = bytearray()

    def write(self, data: bytes) -> None:
        step = self.session.write_size
        view = memoryview(data)
        if self._held:
            taken = step - len(self._held)
            self._held += view[:taken]
            view = view[taken:]
            if len(self._held) < step:
                return
            self._send_piece(self._held)
            self._held = bytearray()
        while len(view) >= step:
            self._send_piece(view[:step])
            view = view[step:]
        self._held += view

    def _send_piece(self, piece: bytes | bytearray | memoryview) -> None:
        while len(self.sent) >= WRITES_IN_FLIGHT:
            self._settle(self.sent.popleft()[0])
        number = self.send(CMD_WRITE, self.handle, int64(self.written), piece)
        self.sent.append((number, self.written, len(piece)))
        self.written += len(piece)

    def _settle(self, number: int) -> None:
        kind, message = self.answer(number)
        if kind != CMD_STATUS:
            raise SSHError("writing: the server answered out of protocol")
        try:
            _check_status(message, "writing a file")
        except EOFError:
            raise SSHError("writing: the server answered out of protocol") from None

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            if self._held:
                self._send_piece(self._held)
                self._held = bytearray()
            while self.sent:
                self._settle(self.sent.popleft()[0])
        finally:
            self.session._close_handle(self.handle)


__all__ = [
    "DIR",
    "FILE",
    "LINK",
    "OTHER",
    "FileError",
    "FileExists",
    "FileReader",
    "FileStat",
    "FileWriter",
    "NoSuchFile",
    "NotAFile",
    "NotEmpty",
    "PermissionDenied",
    "SFTPSession",
    "ShortFile",
]
