"""The draft budget: step costs by size, acceptance by kind, and the plan that cuts drafts to
the tokens that pay for themselves."""

from __future__ import annotations

import pytest

from tallow.draft_budget import (
    MAX_RISE,
    PROBE_EVERY,
    TIME_WEIGHT,
    Acceptance,
    Draft,
    StepTimes,
    expected_kept,
    plan,
)


def times(costs: dict[int, float]) -> StepTimes:
    """Step times with each size measured at ``costs`` (after its first step, which is not
    counted)."""
    t = StepTimes()
    for n, seconds in costs.items():
        t.observe(n, seconds)
        t.observe(n, seconds)
    return t


def test_step_times_interpolate_and_extend_what_was_measured() -> None:
    t = times({1: 2.0, 3: 3.0, 5: 4.0})
    assert t.cost(1) == 2.0
    assert t.cost(2) == pytest.approx(2.5)
    assert t.cost(9) == pytest.approx(6.0)  # along the slope from the smallest to the largest
    assert times({1: 2.0, 3: 3.5, 5: 4.0}).cost(9) == pytest.approx(6.0)
    # Unmeasured below the first: the same.
    assert times({2: 3.0, 4: 4.0}).cost(1) == pytest.approx(2.5)
    # One size measured: the prior's shape, scaled to it.
    one = times({1: 2.0})
    assert one.cost(1) == 2.0 and one.cost(11) > 2.0


def test_the_first_step_of_a_size_is_not_counted() -> None:
    t = times({1: 1.0, 3: 1.2})
    # Its buffers grown, say: ten times what the line through the others says.
    t.observe(9, 20.0)
    assert t.cost(9) == pytest.approx(1.0 + 8 * 0.1)
    t.observe(9, 1.8)
    assert t.cost(9) == pytest.approx(1.8)


def test_one_slow_step_moves_a_size_by_a_bounded_amount() -> None:
    t = times({1: 1.0, 9: 2.0})
    t.observe(9, 50.0)
    assert t.cost(9) == pytest.approx(2.0 * (1 + TIME_WEIGHT * (MAX_RISE - 1)))


def test_step_times_are_moving_averages() -> None:
    t = times({4: 1.0})
    for _ in range(200):
        t.observe(4, 3.0)
    assert t.cost(4) == pytest.approx(3.0, rel=1e-3)


def test_a_draft_is_cut_where_its_tokens_cost_more_than_they_gain() -> None:
    # Each token beyond the first costs a fifth of a one-token step.
    t = times({1: 1.0, 2: 1.2, 3: 1.4, 9: 2.6})
    # Seldom kept: nothing is worth verifying.
    assert plan([Draft(alpha=0.1, length=8)], 1, t) == [(0, [])]
    # Always kept: the whole draft.
    assert plan([Draft(alpha=1.0, length=8)], 1, t) == [(8, [])]
    # In between: the length with the most expected tokens per second.
    k, _ = plan([Draft(alpha=0.6, length=8)], 1, t)[0]
    rates = [(1 + expected_kept(0.6, n)) / t.cost(1 + n) for n in range(9)]
    assert k == max(range(9), key=rates.__getitem__) and 0 < k < 8


def test_a_costly_first_token_is_taken_where_more_tokens_pay_for_it() -> None:
    # The first extra token costs half a step, the next ones a tenth: one token alone loses,
    # two or three win.
    t = times({1: 1.0, 2: 1.5, 3: 1.6, 4: 1.7})
    alpha = 0.45
    assert (1 + alpha) / t.cost(2) < 1.0 < (1 + expected_kept(alpha, 3)) / t.cost(4)
    k = plan([Draft(alpha=alpha, length=3)], 1, t)[0][0]
    rates = [(1 + expected_kept(alpha, n)) / t.cost(1 + n) for n in range(4)]
    assert k == max(range(4), key=rates.__getitem__) >= 2


def test_guesses_get_tokens_only_where_they_pay() -> None:
    cheap = times({1: 1.0, 20: 1.0 + 19 * 0.01})
    costly = times({1: 1.0, 20: 1.0 + 19 * 0.3})
    draft = Draft(alpha=0.5, length=4, guesses=[(0, 3), (2, 2), (4, 2)], beta=0.8)
    k, lengths = plan([draft], 1, cheap)[0]
    # A guess leaving the draft past its end has no place; the others take their tokens.
    assert k == 4 and lengths == [3, 2, 0]
    # Where a token costs more than a guess's token is worth, none.
    unlikely = Draft(alpha=0.5, length=4, guesses=[(0, 3), (2, 2)], beta=0.2)
    assert plan([unlikely], 1, costly)[0][1] == [0, 0]


def test_later_drafts_of_a_step_pay_for_their_own_tokens() -> None:
    t = times({1: 1.0, 2: 1.1, 40: 4.9})
    both = plan([Draft(alpha=0.95, length=8), Draft(alpha=0.95, length=8)], 2, t)
    assert [k for k, _ in both] == [8, 8]


def test_acceptance_is_counted_per_request_and_kind_beside_the_engine() -> None:
    a = Acceptance()
    fresh = a.rate("r", "n1")
    for _ in range(20):
        a.observe("r", "n1", proposed=4, kept=0)
        a.observe("r", "follow", proposed=4, kept=4)
    assert a.rate("r", "n1") < 0.1 < fresh < a.rate("r", "follow")
    # Another request starts from the engine's average of the kind.
    assert a.rate("s", "n1") < fresh
    a.finish("r")
    assert a.rate("r", "n1") == a.rate("s", "n1")


def test_a_request_cut_to_nothing_is_probed_again() -> None:
    a = Acceptance()
    probes = [a.probe("r", cut=True) for _ in range(3 * PROBE_EVERY)]
    assert probes.count(True) == 3 and probes[PROBE_EVERY - 1]
    assert not a.probe("r", cut=False)
