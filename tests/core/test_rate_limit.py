"""A session's control budget (``handlers/core/rate_limit.py``): token buckets on a given clock,
one notice per episode of refusals, a close for a client that keeps flooding."""

from __future__ import annotations

from handlers.core.rate_limit import ControlBudget, ControlLimits, Verdict

LIMITS = ControlLimits(rate_per_s=10, burst=5, answer_rate_per_s=2, answer_burst=2, close_after_s=3)


def verdicts(budget: ControlBudget, times: list[float], moves_answer: bool = False) -> list[Verdict]:
    return [budget.check(t, moves_answer) for t in times]


def test_a_burst_is_taken_then_the_next_is_refused_with_one_notice() -> None:
    """``burst`` messages at once are taken; the next is told, those right after are dropped."""
    budget = ControlBudget(LIMITS)
    got = verdicts(budget, [100.0] * 8)
    assert got == [Verdict.TAKE] * 5 + [Verdict.TELL, Verdict.DROP, Verdict.DROP]
    assert 0 < budget.retry_after_s <= 0.1 + 1e-9  # one token at 10/s


def test_tokens_come_back_at_the_rate() -> None:
    """After a burst, one message per 1/rate seconds is taken again."""
    budget = ControlBudget(LIMITS)
    verdicts(budget, [0.0] * 5)
    assert budget.check(0.05) is Verdict.TELL
    assert budget.check(0.26) is Verdict.TAKE  # 2.6 tokens came back, 1.6 after this one
    assert budget.check(0.27) is Verdict.TAKE


def test_the_clock_may_start_near_zero() -> None:
    """A freshly booted machine's monotonic clock starts near 0: the first message is taken."""
    assert ControlBudget(LIMITS).check(0.0) is Verdict.TAKE
    assert ControlBudget(LIMITS).check(0.001, moves_answer=True) is Verdict.TAKE


def test_answers_have_their_own_smaller_budget() -> None:
    """Questions and cancels also take from the answer bucket; pings are still taken after it is empty."""
    budget = ControlBudget(LIMITS)
    assert verdicts(budget, [1.0, 1.0, 1.0], moves_answer=True) == [Verdict.TAKE, Verdict.TAKE, Verdict.TELL]
    assert budget.check(1.0) is Verdict.TAKE  # a ping: the control bucket still has tokens
    assert budget.retry_after_s == 0.5  # the answer bucket refills at 2/s


def test_a_refused_message_takes_no_token() -> None:
    """Refusals do not spend tokens, so a flood cannot push the next allowed time further out."""
    budget = ControlBudget(LIMITS)
    verdicts(budget, [0.0] * 5)
    verdicts(budget, [0.01 * i for i in range(1, 10)])  # all refused
    assert budget.check(0.1) is Verdict.TAKE


def test_the_client_is_told_once_per_episode() -> None:
    """A client that keeps flooding hears of it once (some clients stop at any error); after a
    quiet second, a new flood is told again."""
    budget = ControlBudget(ControlLimits(rate_per_s=1, burst=1, close_after_s=60))
    got = verdicts(budget, [i * 0.01 for i in range(300)])  # 100 messages a second for 3 s
    assert got.count(Verdict.TAKE) == 3  # the burst of one, then one a second (at 1 s and 2 s)
    assert got.count(Verdict.TELL) == 1
    assert got.count(Verdict.DROP) == 300 - 3 - 1
    assert verdicts(budget, [5.0, 5.0]) == [Verdict.TAKE, Verdict.TELL]


def test_a_client_that_keeps_flooding_is_closed() -> None:
    """Still refused ``close_after_s`` into an episode: CLOSE."""
    budget = ControlBudget(LIMITS)
    got = verdicts(budget, [i * 0.01 for i in range(400)])
    assert Verdict.CLOSE in got
    first_close = got.index(Verdict.CLOSE) * 0.01
    assert 3.0 <= first_close < 3.1


def test_a_quiet_second_ends_the_episode() -> None:
    """Refused, then quiet for a second: a new flood starts a new episode (no close yet)."""
    budget = ControlBudget(LIMITS)
    for start in (0.0, 2.5, 5.0, 7.5):  # 2.5 s floods with quiet gaps between them
        got = verdicts(budget, [start + i * 0.01 for i in range(150)])
        assert Verdict.CLOSE not in got
        budget.check(start + 2.49)  # nothing until the next flood, 1 s later


def test_a_steady_client_under_the_rate_is_never_refused() -> None:
    """A client at 80% of the rate for a minute never hears of the budget."""
    budget = ControlBudget(LIMITS)
    assert set(verdicts(budget, [i / 8 for i in range(480)])) == {Verdict.TAKE}
