"""A link reads a message's row sets straight from their Roaring bytes
(:func:`flight.links.link._rows`): the same row sets as the keys :func:`decode_rows` gives,
and a key past the int64 range is refused as the int64 keys' way refused it."""

from __future__ import annotations

import numpy as np
import pytest
from pyroaring import BitMap64

from engine.errors import ProtocolError
from engine.rowset import RowSet
from flight.links.link import _rows
from flight.streams.decoder import decode_rows


@pytest.mark.parametrize("seed", range(20))
def test_row_sets_from_bytes_are_the_decoded_keys(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.choice([0, 1, 5, 1_000, 20_000]))
    span = int(rng.choice([10, 100_000, 1 << 40, (1 << 63) - 1]))
    keys = np.unique(rng.integers(0, span, n, dtype=np.int64))
    if seed % 5 == 0 and keys.size:
        keys[-1] = (1 << 63) - 1  # the largest row key
        keys = np.unique(keys)
    data = RowSet.from_keys(keys, assume_sorted=True).serialize() if keys.size else b""
    rows = _rows(data)
    assert np.array_equal(rows.keys(), decode_rows(data))
    assert np.array_equal(rows.keys(), keys)
    assert rows == RowSet.from_keys(decode_rows(data), assume_sorted=True)


def test_a_key_past_int64_is_a_protocol_error() -> None:
    data = BitMap64([3, 1 << 63]).serialize()
    with pytest.raises(ProtocolError, match="row key"):
        _rows(data)
