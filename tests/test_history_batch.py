"""``History.record_many`` (the engine's form, many scopes at once) keeps exactly what
``record`` and ``record_held`` (one scope at a time, what ``Engine(reference=True)`` uses)
keep: the same samples, the same running sums bit for bit, shifted down at the same samples,
over runs long enough to trim and compact many times; with unknown values, values of the
wrong type, scopes that come and go, the clock standing still or going back, and a bound on
samples, and samples recorded and scopes forgotten in between. (The engine property test
runs too few ticks to reach a compaction.)"""

from __future__ import annotations

import random
from itertools import accumulate

import pytest

from gpuwarden.engine.history import History, Track
from gpuwarden.playbook.expr import Series

T0 = 1_767_225_600.0
KEYS = ("gpu:0", "gpu:1", "gpu:2")


def _series(kind: str, window: float) -> Series:
    return Series(
        0 if kind == "value" else 1, "gpu", kind, compile("0", "<t>", "eval"), window, kind
    )


def _state(track: Track | None) -> object:
    """Everything a track keeps, dropped samples and all: equal only if the samples, the
    running sums (bit for bit) and the compactions are the same."""
    if track is None:
        return None
    track.sum_up()  # written when first read
    sums = (track.sx, track.sv, track.sxx, track.sxv)
    # ... as appending each sample would have written them, one addition at a time
    xs = [t - track.base for t in track.times]
    assert sums == (
        list(accumulate(xs, initial=0.0)),
        list(accumulate(track.values, initial=0.0)),
        list(accumulate([x * x for x in xs], initial=0.0)),
        list(accumulate([x * v for x, v in zip(xs, track.values, strict=True)], initial=0.0)),
    )
    return (track.base, track.start, track.times, track.values, sums)


def _run(seed: int, max_samples: int, window: float) -> None:
    rng = random.Random(seed)
    value, held = _series("value", window), _series("held", 0.0)
    one, many = History(max_samples), History(max_samples)
    now = T0
    compacted, kept = 0, 0
    for tick in range(3000):
        now += rng.choice((1.0, 1.0, 1.0, 1.0, 0.0, 2.5, 7.0)) if tick % 997 else -50.0
        keys = [k for k in KEYS if k == "gpu:0" or rng.random() < 0.995]  # gpu:0 stays
        sampled: list[float | bool | None] = [
            rng.choice((None, True, 1.0 * rng.randint(0, 100), rng.random() * 1e3))
            if rng.random() < 0.1
            else 40.0 + 0.25 * tick + rng.random()
            for _ in keys
        ]
        flags = [rng.random() < 0.8 for _ in keys]
        if tick % 173 == 0:  # a sample recorded the other way first: the batch's replaces it
            for history in (one, many):
                history.record("gpu:0", value, 123.0, now)
        if tick % 131 == 0:  # a scope forgotten, although it is back at once
            for history in (one, many):
                history.forget(["gpu:0"])
        for key, v, f in zip(keys, sampled, flags, strict=True):
            one.record(key, value, None if isinstance(v, bool) else v, now)
            one.record_held(key, held, f, now)
        many.record_many(keys, value, sampled, now)
        many.record_many(keys, held, flags, now)
        one.forget_except(set(keys))
        many.forget_except(set(keys))
        track = many.track("gpu:0", 0)
        if track is not None:  # the lists shrink when shifted down (or the clock went back)
            compacted += len(track.times) < kept and tick % 997 != 0
            kept = len(track.times)
        for key in KEYS:
            assert _state(many.track(key, 0)) == _state(one.track(key, 0)), (seed, tick, key)
            assert many.view(key, now).held_for(1) == one.view(key, now).held_for(1)
            if one.track(key, 0) is not None:
                mine, theirs = many.view(key, now), one.view(key, now)
                assert mine.predict(0, 600, window) == theirs.predict(0, 600, window)
                assert mine.avg(0, window) == theirs.avg(0, window)
    assert compacted  # the run reached the shifting down


@pytest.mark.parametrize(
    ("seed", "max_samples", "window"), [(1, 100_000, 20.0), (2, 100, 600.0), (3, 100_000, 90.0)]
)
def test_record_many_keeps_what_record_keeps(seed: int, max_samples: int, window: float) -> None:
    _run(seed, max_samples, window)
