"""`strip_logprobs`'s textual path on malformed records, to the byte (from a mutation review of dlq.py).

Records orjson cannot read are stripped by scanning the text (`_strip_text`, `_value_end`); the fuzz tests
check that no logprob digits survive, these pin exactly what is kept, where a value ends and where a
mention cuts the record.
"""

from __future__ import annotations

import pytest

from streams.dlq import strip_logprobs


@pytest.mark.parametrize(
    ("raw", "stored"),
    [
        # An escaped quote inside a logprobs string value does not end it: nothing of the value is kept.
        (
            b'{"top_logprobs": "\\"-0.0123456789", "x": NaN}',
            b'{"top_logprobs": "<removed>", "x": NaN}',
        ),
        # A mention right after a removed value cuts the rest of the record, as one anywhere else does.
        (
            b'{"logprobs":"-0.5"logprob=-0.0123456789, NaN',
            b'{"logprobs":"<removed>"<removed>',
        ),
        # A string value ends at its closing quote: what follows it is kept as it was.
        (
            b'{"top_logprobs": "-0.5" , "x": NaN}',
            b'{"top_logprobs": "<removed>" , "x": NaN}',
        ),
        # A scalar ends at the bracket that closes its object, and the bracket is kept.
        (
            b'{"x": NaN, "top_logprobs": -0.5}',
            b'{"x": NaN, "top_logprobs": "<removed>"}',
        ),
        (
            b'[{"top_logprobs": 1}, {"a": 2, "b": NaN}]',
            b'[{"top_logprobs": "<removed>"}, {"a": 2, "b": NaN}]',
        ),
        # Two logprobs keys back to back (no comma) are two keys, each keeping its name.
        (
            b'{"top_logprobs":"a""logprobs":"b","x":NaN}',
            b'{"top_logprobs":"<removed>""logprobs":"<removed>","x":NaN}',
        ),
        # A key whose escape is not valid JSON names nothing: its value is kept.
        (
            b'{"a\\x": 5, "y": NaN}',
            b'{"a\\x": 5, "y": NaN}',
        ),
    ],
)
def test_the_textual_path_removes_exactly_the_logprobs_values(raw: bytes, stored: bytes) -> None:
    assert strip_logprobs(raw, 10_000) == stored


def test_a_negative_cap_stores_nothing() -> None:
    assert strip_logprobs(b'{"a": NaN}', -1) == b""
