"""Base64 of a byte stream, written piece by piece straight into the one `bytes` object a response
sends, with pybase64's SIMD codec (the library vLLM encodes `kwargs_data` with).

`pybase64.b64encode` takes one contiguous input and returns a new object, so an item's
`"` + base64(msgpack head + pixels + tail) + `"` used to cost the pieces' encodings plus a join
that copied the 7 MB of a 720p image's text once more (as much CPU as the encoding itself, in the
server's profile). pybase64's extension module also exports libbase64's streaming encoder
(`base64_stream_encode_init/_encode/_final`, aklomp/base64, which carries up to 2 bytes between
calls); `Base64Writer` feeds it each piece as it is produced (the msgpack head, each band of
patchified rows while it is still in the CPU cache, the tail) and writes the characters into a
`bytes` object of the final size, quotes included. The foreign calls release the GIL (ctypes).

Writing into a `bytes` object: the object is created uninitialised by `PyBytes_FromStringAndSize
(NULL, n)`, nobody else holds it (refcount 1, its hash not computed) until `finish` returns it
complete, which is how CPython's own C code fills new bytes objects.

Used only when the exported functions exist and encode a set of probes, fed in uneven pieces,
exactly as `pybase64.b64encode` does (checked once per process); otherwise `available()` is False
and callers join pybase64's output as before.
"""

from __future__ import annotations

import ctypes
import os
from functools import cache
from typing import Any

import numpy as np
from pybase64 import b64encode

_STATE_BYTES = 64  # struct base64_state is 4 ints' worth; room to spare


@cache
def _library() -> Any | None:
    try:
        from pybase64 import _pybase64

        lib = ctypes.CDLL(_pybase64.__file__)
        init, encode, final = lib.base64_stream_encode_init, lib.base64_stream_encode, lib.base64_stream_encode_final
    except (ImportError, OSError, AttributeError):
        return None
    init.argtypes = (ctypes.c_void_p, ctypes.c_int)
    init.restype = None
    encode.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_void_p)
    encode.restype = None
    final.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)
    final.restype = None
    return lib


_new_bytes = ctypes.pythonapi.PyBytes_FromStringAndSize
_new_bytes.argtypes = (ctypes.c_void_p, ctypes.c_ssize_t)
_new_bytes.restype = ctypes.py_object


def encoded_size(size: int) -> int:
    """Base64 characters (with padding) for `size` bytes."""
    return (size + 2) // 3 * 4


class Base64Writer:
    """`prefix + b64encode(everything written) + suffix` as one new bytes object; the total input
    size is declared up front (the output is allocated once) and checked at `finish`."""

    def __init__(self, total: int, prefix: bytes = b"", suffix: bytes = b"") -> None:
        lib = _library()
        if lib is None:
            raise RuntimeError("pybase64's streaming encoder is not available")
        self._lib = lib
        self._total = total
        self._written = 0
        self._suffix = suffix
        self._size = len(prefix) + encoded_size(total) + len(suffix)
        self._out = _new_bytes(None, self._size)
        # the address of the new object's characters (c_char_p of a bytes object points into it)
        self._base: int = ctypes.cast(ctypes.c_char_p(self._out), ctypes.c_void_p).value or 0
        ctypes.memmove(self._base, prefix, len(prefix))
        self._pos = len(prefix)
        self._state = ctypes.create_string_buffer(_STATE_BYTES)
        self._outlen = ctypes.c_size_t()
        self._outlen_ref = ctypes.byref(self._outlen)
        lib.base64_stream_encode_init(self._state, 0)  # 0: libbase64 picks the CPU's codec

    def write(self, data: bytes | np.ndarray) -> None:
        """Append `data` (bytes, or a C-contiguous array: its raw bytes)."""
        if isinstance(data, np.ndarray):
            if not data.flags.c_contiguous:
                raise ValueError("Base64Writer.write needs a C-contiguous array")
            size, address = data.nbytes, data.ctypes.data
        else:
            size, address = len(data), ctypes.cast(ctypes.c_char_p(data), ctypes.c_void_p).value or 0
        self.write_raw(address, size)

    def write_raw(self, address: int, size: int) -> None:
        """Append the `size` bytes at `address` (of an object the caller keeps alive): `write`
        without working out the address again, for a buffer written once per band."""
        if size == 0:
            return
        if self._written + size > self._total:
            raise ValueError("more data written than declared")
        # No overrun: the output was sized for the declared total, and no more is accepted.
        self._lib.base64_stream_encode(self._state, address, size, self._base + self._pos, self._outlen_ref)
        self._pos += self._outlen.value
        self._written += size

    def finish(self) -> bytes:
        if self._written != self._total:
            raise ValueError(f"declared {self._total} bytes, wrote {self._written}")
        self._lib.base64_stream_encode_final(self._state, self._base + self._pos, ctypes.byref(self._outlen))
        self._pos += self._outlen.value
        if self._pos + len(self._suffix) != self._size:
            raise RuntimeError("base64 stream produced an unexpected length")
        ctypes.memmove(self._base + self._pos, self._suffix, len(self._suffix))
        out, self._out = self._out, b""
        return out


def _probe() -> bool:
    rng = np.random.default_rng(20261201)
    for size, cuts in ((0, ()), (1, ()), (2, (1,)), (3, (1, 2)), (1000, (1, 5, 5, 700)), (100_003, (3, 4, 50_000))):
        data = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
        writer = Base64Writer(size, b'"', b'"')
        start = 0
        for cut in (*cuts, size):
            piece = data[start:cut]
            writer.write(np.frombuffer(piece, dtype=np.uint8) if len(piece) % 2 else piece)
            start = cut
        if writer.finish() != b'"' + b64encode(data) + b'"':
            return False
    return True


@cache
def available() -> bool:
    """The streaming encoder is there and agrees with pybase64.b64encode (checked once)."""
    if _library() is None or os.environ.get("RENDER_SERVICE_NO_B64_STREAM"):
        return False
    try:
        return _probe()
    except Exception:  # any trouble: the join path
        return False
