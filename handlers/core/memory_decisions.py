"""The core's decisions about the session's memory (``SessionMachine`` inherits them): which
accepted frames and which words are kept, a question about a past range answered over its
remembered keyframes, a search run as rounds of yes/no checks between the session's own
engine jobs (a question stops a round; it runs again after), and forgetting. Pure."""

from __future__ import annotations

from handlers.core.answer import Answer
from handlers.core.effects import (
    Caption,
    Captioned,
    Check,
    Checked,
    Effect,
    FindMemory,
    ForgetMemory,
    KeepCaption,
    KeepMoment,
    KeepNote,
    LoadMoments,
    MemoryForgotten,
    MemoryFound,
    MomentsLoaded,
    Now,
    Recall,
    Recalled,
    Send,
    Tally,
    error_event,
)
from handlers.core.events import MemoryCleared, MemoryHit, MemoryProgress, MemoryResults, WatchFired
from handlers.core.jobs import CaptionStep, CheckStep
from handlers.core.lifecycle import SlotState
from handlers.core.memory import (
    RECALL_FRAMES,
    Keyframes,
    SearchRun,
    moment_url,
    recalled_frames,
    resolve_range,
)
from handlers.core.negotiation import MemoryPolicy
from handlers.core.prompt import render_timeline
from handlers.media.preparation import PreparedFrame
from handlers.wire.commands import AnswerRequest
from handlers.wire.errors import ErrorCode, SessionError
from handlers.wire.protocol import MemorySearch, VideoFrame, VideoQuery, origin_of


class MemoryDecisions:
    """The machine's memory half (its state: ``_memory`` (the server's policy, None when it
    keeps no memory), ``_keyframes`` (None while this session remembers nothing),
    ``_caption_due`` (the start of the moment whose caption waits), ``_caption_stopping``
    (the running caption gives way to the session's own work) and ``_search``; the rest of its decisions: ``_ask``, ``_wait_or``, ``_start``, ``_next_work``)."""

    def _remembering(self, config_enabled: bool | None) -> None:
        """Whether this session remembers: its ``session.config`` says, else the server."""
        policy = self._memory
        enabled = policy is not None and (policy.default if config_enabled is None else config_enabled)
        self._keyframes = Keyframes(policy) if enabled and policy is not None else None
        self.state.earlier_chars = policy.context_chars if self._keyframes is not None and policy is not None else 0

    def _need_memory(self) -> MemoryPolicy:
        if self._memory is None or self._keyframes is None:
            where = "this server keeps no memory" if self._memory is None else "memory is off for this session"
            raise SessionError(ErrorCode.MEMORY_OFF, f"{where} (session.config memory.enabled)")
        return self._memory

    # ------------------------------------------------------------------ keeping
    def _keep_frame(self, event: VideoFrame, prepared: PreparedFrame, frame_ms: float | None) -> list[Effect]:
        """An accepted frame (received at ``frame_ms``) is kept when it is a keyframe; its
        caption is due (one that waited for its turn is skipped for it)."""
        if self._keyframes is None or frame_ms is None or not self._keyframes.take(prepared.thumb, frame_ms):
            return []
        effects: list[Effect] = [KeepMoment(prepared.raw, frame_ms, self.state.image_side(event))]
        if self._memory is not None and self._memory.caption_tokens > 0 and self.warm_prefix:
            if self._caption_due is not None:
                effects.append(Tally("captions_skipped"))
            self._caption_due = frame_ms
        return effects

    def _keep_note(self, kind: str, now: Now, text: str | None) -> list[Effect]:
        if self._keyframes is None or not text or not text.strip():
            return []
        return [KeepNote(kind, now.wall_ms, text.strip())]  # type: ignore[arg-type]

    def _keep_answer(self, answer: Answer, now: Now) -> list[Effect]:
        """An ended answer's question and words."""
        if not answer.prompted:
            return []
        return self._keep_note("question", now, answer.question) + self._keep_note("answer", now, answer.kept_text)

    def _keep_fires(self, events: list[object], now: Now) -> list[Effect]:
        """Each watch that fired, with its condition."""
        effects: list[Effect] = []
        for event in events:
            if isinstance(event, WatchFired):
                spec = next((w.spec for w in self.state.watches if w.watch_id == event.watch_id), None)
                condition = spec.condition if spec is not None and spec.condition else "something changed"
                effects += self._keep_note("fire", now, f"{event.watch_id}: {condition}")
        return effects

    # ------------------------------------------------------------------ asking about the past
    def _recall(self, event: VideoQuery | AnswerRequest, received: float, now: Now) -> list[Effect]:
        self._need_memory()
        assert event.range is not None
        start, end = resolve_range(event.range.from_ms, event.range.to_ms, now.wall_ms)
        n = min(self.state.config.num_frames or RECALL_FRAMES, RECALL_FRAMES)
        most = self.state.capabilities.max_images
        question = self.state.recall_question(event) if isinstance(event, AnswerRequest) else event.text
        return [Recall(event, received, start, end, min(n, most) if most else n, question)]

    def _recalled(self, result: Recalled, now: Now) -> list[Effect]:
        if not result.moments:
            error = SessionError(ErrorCode.NO_FRAMES, "nothing is remembered in that range")
            return [Send(error_event(error, origin_of(result.event)))]
        origin = origin_of(result.event) if isinstance(result.event, AnswerRequest) else None
        return self._wait_or(result.event, now, lambda later: self._guarded(
            result.event, lambda: self._ask(self._plan_recall(result), result.received, later, origin=origin)))

    def _plan_recall(self, result: Recalled) -> Answer:
        """An answer over the range's keyframes and the question only, out of the conversation
        (the warm prefix and the timeline stay as they are)."""
        request = result.event if isinstance(result.event, AnswerRequest) else None
        return self.state.plan_recall(recalled_frames(result.moments), result.question, request)

    # ------------------------------------------------------------------ searching
    def _search_memory(self, event: MemorySearch, now: Now) -> list[Effect]:
        policy = self._need_memory()
        if self._search is not None:
            raise SessionError(ErrorCode.MEMORY_BUSY, "a memory.search is running; wait for its memory.results")
        if event.condition and not self.state.capabilities.token_probabilities:
            raise SessionError(ErrorCode.MEMORY_OFF, "this engine cannot check a condition; search by text")
        run = SearchRun(event, *resolve_range(event.from_ms, event.to_ms, now.wall_ms))
        self._search = run
        return [FindMemory(run, policy.max_search_moments)]

    def _memory_found(self, result: MemoryFound, now: Now) -> list[Effect]:
        run = result.run
        session = self.memory_id
        text_hits = [
            MemoryHit(moment_id=h.moment.moment_id, start_ms=h.moment.start_ms, end_ms=h.moment.end_ms,
                      match=h.text, kind=h.kind, caption=h.moment.caption, url=moment_url(session, h.moment.moment_id))
            for h in result.text if h.moment is not None
        ]
        if not run.event.condition:
            run.hits = text_hits
            return self._search_done(run)
        moments = result.moments
        if run.event.text:  # both: the condition is checked on the moments the text found
            found = {h.moment_id for h in text_hits}
            moments = [m for m in moments if m.moment_id in found]
        run.pending.extend(moments)
        run.total = len(moments)
        return [Send(MemoryProgress(search_id=run.search_id, checked=0, total=run.total))] + self._load_next(run, now)

    def _load_next(self, run: SearchRun, now: Now) -> list[Effect]:
        batch = run.next_batch()
        if batch:
            run.loading, run.requested = True, len(batch)
            return [LoadMoments(run, batch)]
        return self._search_done(run) if run.finished else []

    def _moments_loaded(self, result: MomentsLoaded, now: Now) -> list[Effect]:
        run = result.run
        run.loading = False
        run.batch = result.moments
        run.skipped += run.requested - len(result.moments)  # gone from the store meanwhile
        if self._search is not run:
            return []
        return self._next_work(now) if run.batch else self._load_next(run, now)

    def _search_done(self, run: SearchRun) -> list[Effect]:
        if self._search is run:
            self._search = None
        return [Send(MemoryResults(search_id=run.search_id, results=run.best(), checked=run.checked,
                                   skipped=run.skipped))]

    def _search_round(self) -> list[Effect]:
        """A round of the search's checks, when a batch is loaded (called by ``_next_work``
        with the engine idle and nothing of the session's own due)."""
        run = self._search
        if run is None or not run.batch:
            return []
        frames = recalled_frames(run.batch)
        condition = (run.event.condition or "").strip()
        prompts = [
            (str(m.moment_id), render_timeline(system_prompt=self.state.system_text(), history=(), turns=(),
                                               open_frames=[f], origin=None, timestamps=False, question=condition))
            for m, f in zip(run.batch, frames, strict=True)
        ]
        self.state.buffer.pin(frames)
        step = CheckStep(frames, prompts, None, search=run)
        self.state.slot.warm()
        self._job = step
        return [Check(step)]

    def _search_checked(self, result: Checked, now: Now) -> list[Effect]:
        """A round of the search ended: its probabilities kept (a stopped round runs again)."""
        step, run = result.step, result.step.search
        assert run is not None
        preempted = self.state.slot.state is not SlotState.WARMING
        self.state.buffer.unpin(step.frames)
        effects: list[Effect] = []
        if result.results is not None and not preempted:
            by_id = {str(m.moment_id): m for m in run.batch}
            session = self.memory_id
            for moment_id, probability, _ms in result.results:
                moment = by_id[moment_id]
                run.checked += 1
                if probability >= run.event.threshold:
                    run.hits.append(MemoryHit(
                        moment_id=moment.moment_id, start_ms=moment.start_ms, end_ms=moment.end_ms,
                        probability=round(probability, 4), caption=moment.caption,
                        url=moment_url(session, moment.moment_id)))
            run.batch = []
            effects.append(Send(MemoryProgress(search_id=run.search_id, checked=run.checked, total=run.total)))
        self._job = None
        self.state.slot.warmed()
        if self.state.slot.may_generate:
            return effects + self._start(now)
        more = self._load_next(run, now) if not run.batch else []
        return effects + more + self._next_work(now)

    # ------------------------------------------------------------------ captions
    def _caption_round(self, now: Now) -> list[Effect]:
        """The due caption, written on the warm prefix (called by ``_next_work`` with the
        engine idle and nothing of the session's own due)."""
        policy, at_ms = self._memory, self._caption_due
        assert policy is not None and at_ms is not None
        self._caption_due = None
        step = self.state.next_caption(policy.caption_prompt, policy.caption_tokens, at_ms)
        if step is None:
            return []
        self.state.slot.warm()
        self._job = step
        return [Caption(step)]

    def _caption_yields(self, now: Now) -> bool:
        """True (once) when a caption runs and the session's own work is due: a prefill of
        the prefix or of the next window (their pace allowing) or a round of checks. The
        caption is stopped for it."""
        if not isinstance(self._job, CaptionStep) or self._caption_stopping:
            return False
        state = self.state
        pace = state.capabilities.warm_interval_s
        prefill = self.warm_prefix and state.slot.behind and self._warmed_at + pace <= now.s
        slide = self.warm_prefix and state.slide is not None and self._slid_at + pace <= now.s
        checks = self._checks and state.check_due(now.s) == 0
        self._caption_stopping = bool(prefill or slide or checks)
        return self._caption_stopping

    def _captioned(self, result: Captioned, now: Now) -> list[Effect]:
        """A caption's job ended: its words kept; one a question or the session's own work
        stopped is written again after it, unless a newer moment is due."""
        step = result.step
        self.state.captioned(step)
        stopped = self.state.slot.state is not SlotState.WARMING or self._caption_stopping
        self._caption_stopping = False
        effects: list[Effect] = []
        text = (result.text or "").strip()
        if text and not stopped:
            effects += [KeepCaption(step.at_ms, text), Tally("captions")]
            self.state.earlier.add(step.at_ms, text)
        elif stopped and self._caption_due is None:
            self._caption_due = step.at_ms
        else:
            effects.append(Tally("captions_skipped"))
        self._job = None
        self.state.slot.warmed()
        if self.state.slot.may_generate:
            return effects + self._start(now)
        return effects + self._next_work(now)

    # ------------------------------------------------------------------ forgetting
    def _forget(self) -> list[Effect]:
        self._need_memory()
        return [ForgetMemory()]

    def _forgotten(self, result: MemoryForgotten, now: Now) -> list[Effect]:
        if self._keyframes is not None:
            self._keyframes = Keyframes(self._keyframes.policy)  # the next frame is a keyframe again
        return [Send(MemoryCleared(deleted=result.deleted))]

