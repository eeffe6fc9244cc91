"""The transport between the server and a python-backend worker process.

Two channels:

* Control messages go over a Unix stream socketpair (the worker inherits its end as a file
  descriptor). Each is a 4-byte big-endian length then UTF-8 JSON of plain metadata only: names,
  datatypes, shapes, arena offsets, request ids, parameters, error texts, log lines. A message
  may carry file descriptors (SCM_RIGHTS): that is how a shared-memory arena reaches the other
  side.
* Tensor bytes live in shared memory: an ``Arena`` is a memfd (``os.memfd_create``) mapped by
  both processes. They are never pickled. The exception is a ``TensorMessage``'s tensors
  (a BLS call or its answer on the control socket) of at most ``INLINE_MAX_BYTES`` together: they
  follow the message's JSON on the socket, raw (the message says how many bytes: ``inline``), a
  memfd of their own costing more than the copy.

Ownership (one batch in flight per worker, so no arena is ever written by two processes):

* The input arena is created and written by the parent only, and only while no batch is in
  flight: it writes a batch's inputs, sends ``execute`` with their offsets, and does not touch
  the arena again until the worker's ``result`` (or the worker's death). The worker reads it
  through zero-copy numpy views; those views are valid until its reply, so a model must copy an
  input it keeps past ``execute``.
* Answers do not come back this way: a decoupled model's responses cross the worker's ring
  (cpp/include/inferd/worker_ring.h), as every other model's batches do.
* An arena too small is replaced, never resized in place: the parent creates a larger one and
  sends its descriptor with the next ``execute``; the worker maps it and drops the old mapping.

BYTES tensors are carried in the arena in the protocol's serialization (each element a 4-byte
little-endian length, then its bytes) and decoded into numpy object arrays of ``bytes``.
"""

from __future__ import annotations

import json
import mmap
import os
import socket
import struct
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from inferd.datatypes import DATATYPES, serialize_bytes

_LENGTH: Final = struct.Struct(">I")
_MAX_FDS: Final = 4
# Control messages are small; a frame this large means a corrupt stream, not a big message.
_MAX_MESSAGE_BYTES: Final = 64 << 20
_ALIGNMENT: Final = 64  # each tensor starts on a cache line
_MIN_ARENA_BYTES: Final = 1 << 20
# A TensorMessage whose tensors take at most this many bytes carries them inline.
INLINE_MAX_BYTES: Final = 256 << 10
# Where a received message keeps the bytes that followed it (not JSON: never sent as a key).
_INLINE_KEY: Final = "_inline"

Message = dict[str, Any]


class ChannelClosed(Exception):
    """The other side closed its end of the socket (it exited or died)."""


def encode_message(message: Message) -> bytes:
    """A control message as its frame: length prefix and JSON."""
    body = json.dumps(message, separators=(",", ":")).encode()
    return _LENGTH.pack(len(body)) + body


def decode_message(body: bytes) -> Message:
    message = json.loads(body)
    if not isinstance(message, dict):
        raise ValueError(f"a control message must be a JSON object, got {type(message).__name__}")
    return message


class Channel:
    """One end of the control socket: framed messages, optionally with file descriptors.

    ``send`` may be called from several threads (the worker's model may log from its own); one
    thread receives.
    """

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._buffer = bytearray()
        self._fds: list[int] = []

    @property
    def socket(self) -> socket.socket:
        return self._sock

    def send(self, message: Message, fds: tuple[int, ...] = (), payload: bytes = b"") -> None:
        """Sends ``message`` with ``fds``, and ``payload``'s bytes right after it (the receiver
        finds them under the message's ``_inline`` key)."""
        if fds:
            # The count tells the receiver which descriptors are this message's: one recv may
            # return the end of an earlier frame together with this one's first bytes.
            message = {**message, "fds": len(fds)}
        if payload:
            message = {**message, "inline": len(payload)}
        frame = encode_message(message)
        if payload:
            frame += payload
        if fds:
            # The descriptors travel with the frame's first bytes; the rest follows as a stream.
            sent = socket.send_fds(self._sock, [frame], list(fds))
            frame = frame[sent:]
        if frame:
            self._sock.sendall(frame)

    def buffered(self) -> bool:
        """Whether a whole message is already buffered (receive() returns it without reading)."""
        if len(self._buffer) < _LENGTH.size:
            return False
        length: int = _LENGTH.unpack_from(self._buffer)[0]
        return len(self._buffer) >= _LENGTH.size + length

    def receive(self) -> tuple[Message, list[int]]:
        """The next message and the descriptors that came with it.

        Raises ``ChannelClosed`` at end of stream and ``TimeoutError`` when the socket's
        timeout passes first (the partial frame stays buffered for the next call).
        """
        while True:
            if len(self._buffer) >= _LENGTH.size:
                (length,) = _LENGTH.unpack_from(self._buffer)
                if length > _MAX_MESSAGE_BYTES:
                    raise ValueError(f"control message of {length} bytes: the stream is corrupt")
                end = _LENGTH.size + length
                message = None
                if len(self._buffer) >= end:
                    message = decode_message(bytes(self._buffer[_LENGTH.size : end]))
                    inline = int(message.pop("inline", 0))
                    if not 0 <= inline <= _MAX_MESSAGE_BYTES:
                        raise ValueError(f"a message announced {inline} inline bytes")
                    if len(self._buffer) < end + inline:
                        message = None  # its bytes are still on their way
                    elif inline:
                        message[_INLINE_KEY] = bytes(self._buffer[end : end + inline])
                        end += inline
                if message is not None:
                    del self._buffer[:end]
                    # A frame's descriptors arrive with its first bytes, so they are queued by
                    # the time the frame is whole, after those of the frames before it.
                    count = int(message.pop("fds", 0))
                    if count > len(self._fds):
                        raise ValueError(
                            f"a message announced {count} descriptors, {len(self._fds)} came"
                        )
                    fds, self._fds = self._fds[:count], self._fds[count:]
                    return message, fds
            data, fds, _flags, _addr = socket.recv_fds(self._sock, 1 << 16, _MAX_FDS)
            if not data:
                for fd in fds:
                    os.close(fd)
                raise ChannelClosed("the other side closed the control socket")
            self._buffer += data
            self._fds.extend(fds)

    def close(self) -> None:
        for fd in self._fds:
            os.close(fd)
        self._fds = []
        self._sock.close()


@dataclass(frozen=True)
class TensorRef:
    """Where a tensor lies in an arena: what crosses the socket instead of its bytes."""

    name: str
    datatype: str  # the protocol's name, e.g. "FP32", "BYTES"
    shape: tuple[int, ...]
    offset: int
    nbytes: int

    def to_message(self) -> Message:
        return {
            "name": self.name,
            "datatype": self.datatype,
            "shape": list(self.shape),
            "offset": self.offset,
            "nbytes": self.nbytes,
        }

    @staticmethod
    def from_message(message: Message) -> TensorRef:
        return TensorRef(
            name=str(message["name"]),
            datatype=str(message["datatype"]),
            shape=tuple(int(d) for d in message["shape"]),
            offset=int(message["offset"]),
            nbytes=int(message["nbytes"]),
        )


# BF16 has no numpy dtype of its own (datatypes.py carries it as uint16): uint16 is UINT16.
_DATATYPE_BY_DTYPE: Final[dict[np.dtype[Any], str]] = {
    d.numpy: d.name for d in DATATYPES.values() if not d.is_bytes and d.name != "BF16"
}


def datatype_of(array: npt.NDArray[Any]) -> str:
    """The protocol datatype that holds ``array``: object and string arrays are BYTES."""
    name = _DATATYPE_BY_DTYPE.get(array.dtype)
    if name is not None:
        return name
    if array.dtype.kind in ("O", "S", "U"):
        return "BYTES"
    name = _DATATYPE_BY_DTYPE.get(array.dtype.newbyteorder("<"))
    if name is None:
        raise TypeError(f"no protocol datatype holds numpy dtype {array.dtype}")
    return name


def _element_bytes(element: object) -> bytes:
    if isinstance(element, bytes):
        return element
    if isinstance(element, str):
        return element.encode()
    raise TypeError(f"a BYTES element must be bytes or str, got {type(element).__name__}")


@dataclass(frozen=True)
class _Encoded:
    """A tensor as the bytes it occupies in an arena."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    payload: npt.NDArray[np.uint8]  # serialized for BYTES, the array's own buffer otherwise


def _encode(name: str, array: npt.NDArray[Any]) -> _Encoded:
    datatype = datatype_of(array)
    shape = tuple(int(d) for d in array.shape)
    if datatype == "BYTES":
        raw = serialize_bytes([_element_bytes(e) for e in array.reshape(-1)])
        return _Encoded(name, datatype, shape, np.frombuffer(raw, dtype=np.uint8))
    contiguous = np.ascontiguousarray(array, dtype=DATATYPES[datatype].numpy)
    return _Encoded(name, datatype, shape, contiguous.reshape(-1).view(np.uint8))


def _aligned(size: int) -> int:
    return (size + _ALIGNMENT - 1) // _ALIGNMENT * _ALIGNMENT


class Arena:
    """A shared-memory region (a memfd) mapped into this process.

    The creator passes ``fd`` to the other side, which maps the same pages with its own
    ``Arena(fd, size)``. Numpy views into it keep the mapping alive after it is replaced, until
    they are dropped.
    """

    def __init__(self, fd: int, size: int) -> None:
        self.fd = fd
        self.size = size
        self._map = mmap.mmap(fd, size)

    @staticmethod
    def create(name: str, size: int) -> Arena:
        size = max(_MIN_ARENA_BYTES, mmap.PAGESIZE * -(-size // mmap.PAGESIZE))
        fd = os.memfd_create(name, os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, size)
            return Arena(fd, size)
        except BaseException:
            os.close(fd)
            raise

    def close(self) -> None:
        """Closes the descriptor; the mapping goes when the last view into it does."""
        os.close(self.fd)

    def view(self, ref: TensorRef) -> npt.NDArray[Any]:
        """The tensor at ``ref``: a zero-copy view, or for BYTES a decoded object array."""
        if ref.offset + ref.nbytes > self.size:
            raise ValueError(f"tensor {ref.name!r} lies outside the arena")
        if ref.datatype == "BYTES":
            return deserialize_bytes(self._map[ref.offset : ref.offset + ref.nbytes], ref.shape)
        dtype = DATATYPES[ref.datatype].numpy
        count = ref.nbytes // dtype.itemsize
        return np.frombuffer(self._map, dtype=dtype, count=count, offset=ref.offset).reshape(
            ref.shape
        )

    def _write(self, encoded: list[_Encoded]) -> list[TensorRef]:
        refs: list[TensorRef] = []
        offset = 0
        for tensor in encoded:
            nbytes = tensor.payload.size
            destination = np.frombuffer(self._map, dtype=np.uint8, count=nbytes, offset=offset)
            destination[:] = tensor.payload
            refs.append(TensorRef(tensor.name, tensor.datatype, tensor.shape, offset, nbytes))
            offset += _aligned(nbytes)
        return refs


def deserialize_bytes(data: bytes, shape: tuple[int, ...]) -> npt.NDArray[np.object_]:
    """The protocol's BYTES serialization as a numpy object array of ``bytes``."""
    elements: list[bytes] = []
    position = 0
    while position < len(data):
        (length,) = struct.unpack_from("<I", data, position)
        position += 4
        elements.append(data[position : position + length])
        position += length
    array = np.empty(len(elements), dtype=np.object_)
    array[:] = elements
    return array.reshape(shape)


class ArenaWriter:
    """The writing side's arena: places tensors, replacing the region when it is too small.

    ``place`` returns the new arena when it replaced the region: its descriptor and size must go
    to the reader with the message that carries the returned refs.
    """

    def __init__(self, name: str) -> None:
        self._name = name
        self._arena: Arena | None = None

    def place(
        self, tensors: list[tuple[str, npt.NDArray[Any]]]
    ) -> tuple[list[TensorRef], Arena | None]:
        encoded = [_encode(name, array) for name, array in tensors]
        needed = sum(_aligned(t.payload.size) for t in encoded)
        replaced: Arena | None = None
        if self._arena is None or needed > self._arena.size:
            size = needed if self._arena is None else max(needed, 2 * self._arena.size)
            replaced = Arena.create(self._name, size)
            if self._arena is not None:
                self._arena.close()
            self._arena = replaced
        return self._arena._write(encoded), replaced

    def close(self) -> None:
        if self._arena is not None:
            self._arena.close()
            self._arena = None


class ArenaReader:
    """The reading side's arena: the region the writer last sent."""

    def __init__(self) -> None:
        self._arena: Arena | None = None

    def adopt(self, message: Message, fds: list[int]) -> None:
        """Maps the region a message brought (``message["arena_size"]`` and one descriptor)."""
        if "arena_size" not in message:
            for fd in fds:
                os.close(fd)
            return
        if len(fds) != 1:
            for fd in fds:
                os.close(fd)
            raise ValueError(f"a new arena needs one descriptor, {len(fds)} arrived")
        if self._arena is not None:
            self._arena.close()
        self._arena = Arena(fds[0], int(message["arena_size"]))

    def view(self, ref: TensorRef) -> npt.NDArray[Any]:
        if self._arena is None:
            raise ValueError(f"tensor {ref.name!r} refers to an arena never sent")
        return self._arena.view(ref)

    def close(self) -> None:
        if self._arena is not None:
            self._arena.close()
            self._arena = None


class TensorMessage:
    """A control message with tensors in a shared-memory arena of its own, for a message that is
    not part of the batch protocol (a BLS call or its answer on the control socket): several may
    be in flight at once, so none can share the batch arenas.

    Building it places the tensors (TypeError or ValueError for one no arena holds) and puts
    their refs under ``key``; send ``message`` with ``fds``, inside ``with``, which closes this
    side's descriptor (the receiver has its own by then). No tensors: no arena.
    """

    def __init__(
        self, name: str, message: Message, key: str, tensors: list[tuple[str, npt.NDArray[Any]]]
    ) -> None:
        self.payload = b""
        self._arena: Arena | None = None
        encoded = [_encode(tensor_name, array) for tensor_name, array in tensors]
        if sum(_aligned(t.payload.size) for t in encoded) <= INLINE_MAX_BYTES:
            refs, self.payload = _inline(encoded)
        else:
            refs, self._arena = ArenaWriter(name).place(tensors)
        self.message: Message = {**message, key: [ref.to_message() for ref in refs]}
        self.fds: tuple[int, ...] = ()
        if self._arena is not None:
            self.message["arena_size"] = self._arena.size
            self.fds = (self._arena.fd,)

    def __enter__(self) -> TensorMessage:
        return self

    def __exit__(self, *_: object) -> None:
        if self._arena is not None:
            self._arena.close()


def _inline(encoded: list[_Encoded]) -> tuple[list[TensorRef], bytes]:
    """Tensors laid out as they would be in an arena, in one bytes object."""
    refs: list[TensorRef] = []
    payload = bytearray()
    for tensor in encoded:
        offset = len(payload)
        payload += tensor.payload.tobytes()
        payload += bytes(_aligned(len(payload)) - len(payload))
        refs.append(
            TensorRef(tensor.name, tensor.datatype, tensor.shape, offset, tensor.payload.size)
        )
    return refs, bytes(payload)


def copy_out(
    message: Message, fds: list[int], refs: list[TensorRef]
) -> dict[str, npt.NDArray[Any]]:
    """The tensors a ``TensorMessage`` brought, copied out of its arena (then unmapped) or of
    the bytes that followed it."""
    inline = message.get(_INLINE_KEY)
    if isinstance(inline, bytes):
        for fd in fds:
            os.close(fd)
        return {ref.name: _inline_view(inline, ref) for ref in refs}
    reader = ArenaReader()
    try:
        reader.adopt(message, fds)
        return {ref.name: np.array(reader.view(ref), copy=True) for ref in refs}
    finally:
        reader.close()


def _inline_view(data: bytes, ref: TensorRef) -> npt.NDArray[Any]:
    """The tensor at ``ref`` in a message's inline bytes, as an array of its own."""
    if ref.offset < 0 or ref.nbytes < 0 or ref.offset + ref.nbytes > len(data):
        raise ValueError(f"tensor {ref.name!r} lies outside the message's bytes")
    chunk = data[ref.offset : ref.offset + ref.nbytes]
    if ref.datatype == "BYTES":
        return deserialize_bytes(chunk, ref.shape)
    return np.frombuffer(chunk, dtype=DATATYPES[ref.datatype].numpy).reshape(ref.shape).copy()
