"""The snapshot payload (:func:`failslow.stream.state.pack`): numpy arrays travel as raw
bytes beside a JSON skeleton, exactly (dtype, shape, NaN, extremes), and payloads of the
older format (zstd-compressed JSON) still restore."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pyarrow as pa

from failslow.stream.state import ARRAY_MIN, MAGIC, pack, raw_payload, unpack


def test_arrays_come_back_exactly_and_writable() -> None:
    floats = np.linspace(-1e300, 1e300, 300).reshape(100, 3)
    floats[5, 1] = np.nan
    floats[6, 2] = -np.inf
    state = {
        "i64": np.array([np.iinfo(np.int64).min, -1, 0, np.iinfo(np.int64).max] * 50),
        "u64": np.arange(2**64 - 200, 2**64 - 1, dtype=np.uint64),
        "nested": {"f": floats, "b": np.arange(ARRAY_MIN) % 3 == 0, "list": [1, "x", None]},
        "i32": np.arange(ARRAY_MIN, dtype=np.int32),
        "scalar": np.float64(2.5), "n": 7, "text": "rank's",
    }
    back = unpack(pack(state))
    for path in (("i64",), ("u64",), ("nested", "f"), ("nested", "b"), ("i32",)):
        want: Any = state
        got: Any = back
        for key in path:
            want, got = want[key], got[key]
        assert isinstance(got, np.ndarray) and got.dtype == want.dtype
        assert got.shape == want.shape
        assert got.tobytes() == want.tobytes()  # NaN and infinities bit for bit
        got[...] = 0  # a restored detector may update its arrays in place
    assert back["nested"]["list"] == [1, "x", None]
    assert (back["scalar"], back["n"], back["text"]) == (2.5, 7, "rank's")


def test_small_arrays_are_json_lists() -> None:
    back = unpack(pack({"small": np.arange(ARRAY_MIN - 1), "empty": np.zeros(0)}))
    assert back == {"small": list(range(ARRAY_MIN - 1)), "empty": []}


def test_an_array_is_raw_bytes_and_a_reference_in_the_skeleton() -> None:
    values = np.arange(100_000, dtype=np.int64) * 1_000_003
    raw = raw_payload({"t": values})
    assert len(raw) < len(json.dumps(values.tolist()))
    assert b"$ndarray" in raw and b"1000003," not in raw


def test_a_payload_of_the_older_format_still_restores() -> None:
    state = {"keys": [[1, 2]], "t": [1.5, float("nan")], "nested": {"n": 3}}
    raw = json.dumps(state).encode()
    old = len(raw).to_bytes(8, "little") + pa.Codec("zstd").compress(raw, asbytes=True)
    assert old[:len(MAGIC)] != MAGIC
    back = unpack(old)
    assert back["keys"] == [[1, 2]] and back["nested"] == {"n": 3}
    assert back["t"][0] == 1.5 and np.isnan(back["t"][1])
