"""The core's decisions about the engine's next job (``SessionMachine`` inherits them): a
prefill when the prefix is behind and nothing runs, else a round of watch checks when one is
due, else a prefill of the next window when one slides (``window_slide``), else a timer for the next round, the next paced
prefill (``Capabilities.warm_interval_s``) or the idle timeout; what a prefill's or a round's end
starts (the answer it held back, a fire's answer, the next job). Pure."""

from __future__ import annotations

import logging

from handlers.core.effects import Check, Checked, Effect, Now, Prefill, Send, Stop, Tally, Timer, Warmed
from handlers.core.lifecycle import SlotState
from handlers.core.session_core import Phase
from handlers.wire.errors import SessionError

log = logging.getLogger("livesight.session")


class EngineJobs:
    """The machine's engine half (its state: ``state``, ``_job``, ``_timer``, ``_ending``,
    ``_waiting``, ``_warmed_at`` and ``_slid_at``: when its last prefill of the prefix and of the
    next window started; the rest of its decisions: ``_ask``, ``_start``, ``_checks``)."""

    def _next_work(self, now: Now) -> list[Effect]:
        """A prefill when the prefix is behind, else a round of checks when one is due, else a
        timer for the next round or the idle timeout; nothing while an answer is asked or runs."""
        state, slot = self.state, self.state.slot
        if self._ending or state.phase is not Phase.READY or state.running is not None or self._waiting:
            return []
        idle_at = state.idle_at
        if idle_at is not None and idle_at <= now.s:
            return self._idle(now)  # a running prefill or round of checks is stopped for it
        if slot.state is not SlotState.IDLE:
            if self._caption_yields(now):  # a caption gives way to the session's own work
                return [Stop(self._job)]
            return self._set_timer(idle_at)
        later = [] if idle_at is None else [idle_at]  # when something waiting may run
        pace = state.capabilities.warm_interval_s
        wait = state.check_due(now.s) if self._checks else None
        overdue = wait == 0 and state.check_overdue()  # the round warms the new frames itself
        if self.warm_prefix and slot.behind and not overdue:
            if self._warmed_at + pace > now.s:  # paced: checks may run meanwhile
                later.append(self._warmed_at + pace)
            elif (step := state.next_warm()) is None:
                slot.nothing_to_warm()
            else:
                slot.warm()
                self._job, self._warmed_at = step, now.s
                return [Prefill(step)]
        if wait == 0:
            step = state.next_check(now.s)
            if step is not None:
                slot.warm()
                self._job = step
                return [Check(step)]
            wait = None
        if wait is not None:
            later.append(now.s + wait)
        if self.warm_prefix and state.slide is not None:  # the next window's prefill: after the prefix and the checks
            if self._slid_at + pace > now.s:
                later.append(self._slid_at + pace)
            elif (step := state.next_slide_warm()) is not None:
                slot.warm()
                self._job, self._slid_at = step, now.s
                return [Prefill(step)]
        wake = self._set_timer(min(later, default=None))  # the session's own work due later stops them
        settled = not (self.warm_prefix and (slot.behind or state.slide is not None))
        caption = self._caption_round(now) if self._caption_due is not None and settled else []
        if caption:  # memory, last: a caption, then a search's round
            return caption + wake
        if self._search is not None and self._search.batch:
            return self._search_round() + wake
        return wake

    def _set_timer(self, at: float | None) -> list[Effect]:
        if at == self._timer:
            return []
        self._timer = at
        return [Timer(at)]

    def _idle(self, now: Now) -> list[Effect]:
        """Silence for ``idle_timeout_ms`` after an answer's audio: an answer over the conversation so far."""
        self._timer = None
        try:
            answer, timed_out = self.state.plan_idle()
        except SessionError as exc:
            log.info("idle timeout with nothing to answer over: %s", exc.message)
            return self._next_work(now)
        return self._ask(answer, now.s, now, before=[Send(timed_out)])

    def _warmed(self, result: Warmed, now: Now) -> list[Effect]:
        self.state.warmed(result.step, result.done)
        return self._job_ended(now)

    def _job_ended(self, now: Now) -> list[Effect]:
        """The prefill or round of checks ended: the answer it held back starts, else the next job."""
        self._job = None
        self.state.slot.warmed()
        if self.state.slot.may_generate:
            return self._start(now)
        return self._next_work(now)

    def _checked(self, result: Checked, now: Now) -> list[Effect]:
        """A round of checks ended: unless a question stopped it, its decisions are sent, and the
        first fire is answered when nothing else is asked (the others fire at their next check)."""
        if result.step.search is not None:
            return self._search_checked(result, now)
        preempted = self.state.slot.state is not SlotState.WARMING
        decisions = self.state.checked(result.step, None if preempted else result.results, now.s, now.wall_ms)
        effects: list[Effect] = [Tally("checks", decisions.checks), Tally("skipped", decisions.skipped)]
        effects += self._keep_fires(decisions.events, now)
        self._job = None
        self.state.slot.warmed()
        if self.state.slot.may_generate:  # a question came first: the watch is checked again after it
            return effects + [Send(e) for e in decisions.events] + self._start(now)
        if decisions.fires and self.state.running is None:
            fire = decisions.fires[0]
            try:
                answer = self.state.plan_watch(fire)
            except SessionError as exc:  # no usable frame left for its answer
                log.info("watch %s fired but cannot be answered: %s", fire.watch.watch_id, exc.message)
            else:
                return effects + self._ask(answer, now.s, now, before=[Send(e) for e in decisions.events])
        return effects + [Send(e) for e in decisions.events] + self._next_work(now)
