"""teamrl.config.tools: properties of overrides and merging over generated values."""

from __future__ import annotations

import pytest
import yaml

from teamrl.config.tools import merge, parse_overrides

# ---------------------------------------------------------------------------
# Properties
# ---------------------------------------------------------------------------

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_keys = st.from_regex(r"[a-z_][a-z0-9_]{0,6}", fullmatch=True)
_scalars = st.one_of(
    st.integers(-(10**6), 10**6),
    st.floats(allow_nan=False, allow_infinity=False, width=32),
    st.booleans(),
    st.none(),
    st.text("abcxyz -_./", max_size=8),
)


@settings(max_examples=60, deadline=None)
@given(path=st.lists(_keys, min_size=1, max_size=4), value=_scalars)
def test_override_value_round_trips_through_yaml_text(path, value):
    text = yaml.safe_dump(value, default_flow_style=True).strip()
    if text.endswith("\n..."):
        text = text[: -len("\n...")].strip()
    got = parse_overrides([".".join(path) + "=" + text])
    for key in path:
        got = got[key]
    assert got == value and type(got) is type(value)


_trees = st.recursive(
    _scalars, lambda inner: st.dictionaries(_keys, inner, max_size=3), max_leaves=10
)


@settings(max_examples=60, deadline=None)
@given(a=st.dictionaries(_keys, _trees, max_size=4), b=st.dictionaries(_keys, _trees, max_size=4))
def test_merge_properties(a, b):
    assert merge(a, {}) == a
    assert merge({}, b) == b
    out = merge(a, b)
    assert set(out) == set(a) | set(b)
    for k, v in b.items():
        if not isinstance(v, dict):
            assert out[k] == v
    assert merge(out, b) == out  # idempotent
