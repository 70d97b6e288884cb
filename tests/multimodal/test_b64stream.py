"""b64stream: libbase64's streaming encoder (exported by pybase64) writing one bytes object, fed
in uneven pieces, against pybase64.b64encode of the whole."""

from __future__ import annotations

import numpy as np
import pytest
from pybase64 import b64encode

from render_service.multimodal import b64stream


def test_available_here() -> None:
    # the service's dependency set has it; without it every image takes the join path
    assert b64stream.available()


@pytest.mark.parametrize("size", [0, 1, 2, 3, 4, 5, 6, 7, 100, 4096, 65537, 1_000_003])
def test_pieces_encode_as_the_whole(size: int) -> None:
    rng = np.random.default_rng(size)
    data = rng.integers(0, 256, size, dtype=np.uint8)
    for trial in range(4):
        cuts = sorted(int(c) for c in rng.integers(0, size + 1, trial * 3)) if size else []
        writer = b64stream.Base64Writer(size, b'"', b'"')
        start = 0
        for cut in (*cuts, size):
            piece = data[start:cut]
            writer.write(piece if trial % 2 else piece.tobytes())  # arrays and bytes
            start = cut
        out = writer.finish()
        assert type(out) is bytes
        assert out == b'"' + b64encode(data.tobytes()) + b'"'
        assert hash(out) == hash(bytes(out))  # an ordinary, complete bytes object


def test_no_prefix_or_suffix() -> None:
    writer = b64stream.Base64Writer(5)
    writer.write(b"hello")
    assert writer.finish() == b64encode(b"hello")


def test_writing_more_or_less_than_declared_is_refused() -> None:
    writer = b64stream.Base64Writer(4)
    writer.write(b"abc")
    with pytest.raises(ValueError, match="more data"):
        writer.write(b"de")
    with pytest.raises(ValueError, match="declared 4"):
        writer.finish()


def test_a_strided_array_is_refused() -> None:
    writer = b64stream.Base64Writer(4)
    with pytest.raises(ValueError, match="contiguous"):
        writer.write(np.arange(8, dtype=np.uint8)[::2])
