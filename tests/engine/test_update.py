"""TableUpdate.validate rejects each broken invariant; compose equals sequential application."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.errors import UpdateInvariantError
from engine.rowset import RowSet, RowSetShiftData
from engine.update import TableUpdate, compose


def R(*keys):
    return RowSet.from_keys(list(keys))


def test_valid_update_passes():
    prev, cur = R(0, 1, 2), R(0, 1, 3, 4)
    up = TableUpdate.of(added=R(2), removed=R(2), shifted=RowSetShiftData.from_arrays([2], [2], [1]))
    # remove 2, nothing left to shift at 2; add 2 -> the update yields 0,1,2, and 2 is not in cur
    with pytest.raises(UpdateInvariantError, match="I1: added keys that are not in cur: \\[2\\]"):
        up.validate(prev, cur)
    up = TableUpdate.of(added=R(2), shifted=RowSetShiftData.from_arrays([2], [2], [2]),
                        modified=R(1), modified_columns=["v"])
    up.validate(prev, R(0, 1, 2, 4), columns=["v"])
    assert up.apply(prev) == R(0, 1, 2, 4)


@pytest.mark.parametrize(
    "up, prev, cur, rule",
    [
        (TableUpdate.of(removed=R(7)), R(1), R(1), "I1"),
        (TableUpdate.of(added=R(5)), R(1), R(1), "I1"),
        (TableUpdate.of(modified=R(9), modified_columns=["v"]), R(1), R(1), "I1"),
        (TableUpdate.of(shifted=RowSetShiftData(np.array([0]), np.array([0]), np.array([0]))), R(0), R(0), "S1"),
        # a shift that jumps key 0 over surviving key 1 reorders rows
        (TableUpdate.of(shifted=RowSetShiftData.from_arrays([0], [0], [5])), R(0, 1), R(1, 5), "I2"),
        (TableUpdate.of(added=R(1)), R(1), R(1), "I3"),
        (TableUpdate.of(), R(1), R(1, 2), "I3"),
        (TableUpdate(added=R(2), modified=R(2), modified_columns=frozenset({"v"})), R(1), R(1, 2), "I4"),
        (TableUpdate(modified=R(1)), R(1), R(1), "I5"),
        (TableUpdate(modified_columns=frozenset({"v"})), R(1), R(1), "I5"),
    ],
)
def test_validate_rejects(up, prev, cur, rule):
    with pytest.raises(UpdateInvariantError, match=rule):
        up.validate(prev, cur, columns=["v"])


def test_validate_rejects_unknown_modified_column():
    up = TableUpdate.of(modified=R(1), modified_columns=["nope"])
    with pytest.raises(UpdateInvariantError, match="I5.*nope"):
        up.validate(R(1), R(1), columns=["v"])


@st.composite
def step(draw, prev_keys):
    """A random valid update from a RowSet of ``prev_keys``; returns (update, new keys)."""
    prev = sorted(prev_keys)
    removed = sorted(draw(st.sets(st.sampled_from(prev), max_size=len(prev))) if prev else [])
    surv = [k for k in prev if k not in set(removed)]
    n = len(surv)
    if n and draw(st.booleans()):
        new = sorted(draw(st.sets(st.integers(0, 400), min_size=n, max_size=n)))
    else:
        new = surv
    shift = RowSetShiftData.from_moves(np.array(surv, dtype=np.int64), np.array(new, dtype=np.int64))
    free = [k for k in range(0, 420) if k not in set(new)]
    added = sorted(draw(st.sets(st.sampled_from(free), max_size=8)))
    modified = sorted(draw(st.sets(st.sampled_from(new), max_size=len(new))) if new else [])
    cols = draw(st.sets(st.sampled_from(["a", "b"]), min_size=1)) if modified else set()
    up = TableUpdate.of(R(*added), R(*removed), R(*modified), shift, cols)
    return up, dict(zip(surv, new, strict=False))


def _apply(state, up, moves, tick):
    """Apply an update to {key: (value_version)}; changed rows get the new version ``tick``."""
    out = {}
    removed = set(up.removed.keys().tolist())
    for k, v in state.items():
        if k not in removed:
            out[moves.get(k, k)] = v
    for k in up.modified.keys().tolist():
        out[k] = tick
    for k in up.added.keys().tolist():
        out[k] = tick
    return out


@given(st.sets(st.integers(0, 300), max_size=30), st.data())
def test_compose_equals_sequential(start, data):
    prev = R(*sorted(start))
    u1, m1 = data.draw(step(start))
    mid = u1.apply(prev)
    u1.validate(prev, mid)
    u2, m2 = data.draw(step(set(mid.keys().tolist())))
    end = u2.apply(mid)
    u2.validate(mid, end)

    c = compose(u1, u2, prev)
    c.validate(prev, end)
    assert c.apply(prev) == end

    # content: every row whose value changed in u1 or u2 is added or modified in c,
    # and every other surviving row is untouched by c
    s0 = {k: 0 for k in start}
    s2 = _apply(_apply(s0, u1, m1, 1), u2, m2, 2)
    cm = dict(zip(*[a.tolist() for a in (lambda p: (p, c.shifted.apply_keys(p)))(
        np.array(sorted(k for k in start if k not in set(c.removed.keys().tolist())), dtype=np.int64))], strict=False))
    replay = _apply(s0, c, cm, None)
    for k, v in s2.items():
        if v == 0:
            assert replay[k] == 0, f"row {k} unchanged overall but composed update touches it"
        else:
            assert replay[k] is None, f"row {k} changed but composed update misses it"
    assert set(replay) == set(s2)
    if c.modified:
        assert c.modified_columns <= (u1.modified_columns | u2.modified_columns)


def test_compose_add_then_remove_vanishes():
    prev = R(1)
    u1 = TableUpdate.of(added=R(5))
    u2 = TableUpdate.of(removed=R(5))
    c = compose(u1, u2, prev)
    assert c.empty()


def test_compose_added_then_modified_is_added():
    prev = R(1)
    u1 = TableUpdate.of(added=R(5))
    u2 = TableUpdate.of(modified=R(5, 1), modified_columns=["a"])
    c = compose(u1, u2, prev)
    assert c.added == R(5) and c.modified == R(1) and c.modified_columns == {"a"}


def test_compose_large_updates_stay_vectorized():
    n = 200_000
    prev = RowSet.from_range(0, n)
    u1 = TableUpdate.of(added=RowSet.from_range(n, 2 * n), removed=RowSet.from_range(0, 1000),
                        modified=RowSet.from_range(5000, 50_000), modified_columns=["a"])
    mid = u1.apply(prev)
    s = RowSetShiftData.from_arrays([1000], [2 * n - 1], [10])
    u2 = TableUpdate.of(shifted=s, modified=RowSet.from_range(100_010, 100_020), modified_columns=["b"])
    end = u2.apply(mid)
    c = compose(u1, u2, prev)
    c.validate(prev, end)
    assert c.apply(prev) == end
