"""What a session's prompts are made of (``SessionCore`` inherits it): the prompt of a
planned answer over the timeline or its own context, the prefill that keeps the engine's
prefix warm, and what an ended answer leaves in the timeline. Pure."""

from __future__ import annotations

from dataclasses import replace

from handlers.core.answer import Answer, Outcome
from handlers.core.frames import Frame
from handlers.core.jobs import CaptionStep, WarmStep
from handlers.core.prompt import render_timeline
from handlers.core.timeline import Message, Timeline, TimelineTurn, heard_text, interrupted_answer
from handlers.wire.errors import ErrorCode, SessionError
from server.engines.base import AudioSegment, Prompt


class TimelinePrompts:
    """The core's prompts (its state lives on ``SessionCore``: ``timeline``, ``buffer``, ``config``)."""

    def needs_transcription(self, answer: Answer) -> bool:
        """True when the answer's audio must become text (the engine takes no audio)."""
        return answer.audio is not None and self.voice.transcribes

    def settle_frames(self, answer: Answer) -> None:
        """Drop the answer's frames whose decode failed. Raises ``no_frames`` if none is left."""
        usable = [f for f in answer.frames if f.image is not None]
        self.buffer.unpin([f for f in answer.frames if f.image is None])
        answer.frames = usable
        if not usable:
            raise SessionError(ErrorCode.NO_FRAMES, "no usable frame is buffered")

    def query_prompt(self, answer: Answer) -> Prompt:
        """The prompt for a planned answer (its frames must be decoded): the timeline with the
        answer's new frames admitted (its newest always) and the question closing the open turn.
        Sets ``answer.used``, the frames the prompt holds."""
        answer.prompted = True
        answer.origin = self.origin
        if answer.context is not None:  # the answer's own context, not the timeline
            answer.used = [f for f in answer.frames if f.image is not None]
            return self._render_context(answer)
        timeline = self.timeline
        timeline.forget_evicted()
        usable = [f for f in answer.frames if f.image is not None]
        timeline.admit(usable, newest=usable[-1] if usable else None)
        answer.used = timeline.frames
        return replace(self._render(answer.question, answer.audio, answer.instructions), spoken=answer.spoken)

    def _earlier_text(self, timeline: Timeline) -> str | None:
        """What left ``timeline``'s window, as the captions of its moments. It opens the
        timeline's first turn, in the warm prefix: it changes only when a moment leaves, and
        questions and checks find it cached."""
        frames, origin = timeline.frames, self.origin
        if not self.earlier_chars or not frames or origin is None:
            return None
        return self.earlier.render(frames[0].receive_ts_ms, origin.receive_ts_ms, self.earlier_chars)

    def _render_context(self, answer: Answer) -> Prompt:
        """An answer's own ``input``: its messages in order, the frames first, the last user
        message asking."""
        messages = answer.context or []
        last_user = max((n for n, m in enumerate(messages) if m.role == "user"), default=None)
        turns = []
        for n, m in enumerate(messages):
            if n != last_user:
                turns.append(TimelineTurn([], [Message(m.role if m.role != "system" else "user", m.text or "")]))
        question = messages[last_user].text or "" if last_user is not None else ""
        return render_timeline(
            system_prompt=answer.instructions or self.system_text(), history=(), turns=turns,
            open_frames=answer.used, origin=self.origin, timestamps=self.config.frame_timestamps, question=question,
        )

    def _render(self, question: str | None, audio: AudioSegment | None = None, instructions: str | None = None,
                timeline: Timeline | None = None) -> Prompt:
        timeline = timeline or self.timeline
        return render_timeline(
            system_prompt=instructions or self.system_text(),
            history=timeline.history,
            turns=timeline.turns,
            open_frames=timeline.open,
            origin=self.origin,
            timestamps=self.config.frame_timestamps,
            audio=audio,
            question=question,
            earlier=self._earlier_text(timeline),
        )

    def _release(self, answer: Answer) -> None:
        self.buffer.unpin(answer.frames)
        answer.frames = []

    def _keep(self, answer: Answer) -> None:
        """What an ended answer leaves in the timeline. One that reached the engine closes
        the open turn with its text as generated (a failed one leaves the turn open); an
        interrupted one keeps the text it got to, marked (``timeline.INTERRUPTED_MARK``); one
        the client truncated while it ran keeps what was heard, one it deleted only its
        question. An answer out of the conversation leaves the timeline as it was."""
        kept = answer.kept_text
        if kept is None or not answer.prompted or not answer.in_conversation:
            return
        text = interrupted_answer(kept) if answer.outcome is Outcome.INTERRUPTED else kept
        pieces = answer.audio_pieces
        reply = Message("assistant", text, (answer.item_id,), tuple(pieces))
        if answer.heard_ms is not None and pieces:
            heard = heard_text(reply, answer.heard_ms)
            cut = tuple(p for p in pieces if p[0] <= answer.heard_ms)
            reply = Message("assistant", heard, (answer.item_id,), (*cut, (float(answer.heard_ms), "")))
        question = Message("user", answer.question, tuple(answer.input_ids))
        if answer.context is not None:
            self.close_open_turn([] if answer.deleted else [reply])
        else:
            self.timeline.close_with([question] if answer.deleted else [question, reply])

    def close_open_turn(self, messages: list[Message]) -> None:
        """The client put an assistant message at the end: the frames shown since the last
        turn (the decoded ones) and ``messages`` become a turn."""
        self.timeline.forget_evicted()
        self.timeline.admit(self.buffer.frames)
        self.timeline.close_with(messages)
        self.timeline.edited = True

    def warm_frames(self) -> list[Frame]:
        """Bring the timeline up to date with the buffer (evicted frames out, decoded new
        frames in, up to the first still decoding) and return its frames: what a warm
        prefix covers now. Returns none when there is nothing to warm: no frame has come
        since the last answer and none has left (the answer itself is cached already).
        Frames that left during an answer are forgotten here or by the next query."""
        before = self.timeline.frames
        self.timeline.forget_evicted()
        self.timeline.admit(self.buffer.frames)
        frames = self.timeline.frames
        edited, self.timeline.edited = self.timeline.edited, False
        if not self.timeline.open and frames == before and not edited:
            return []
        return frames

    def warm_prompt(self, frames: list[Frame] | None = None) -> Prompt:
        """The open prefix that the next query will start with (``frames``: ``warm_frames()``)."""
        return self._render(None)

    def next_warm(self) -> WarmStep | None:
        """The prefill due now (its frames pinned until ``warmed``), or None when the
        engine's prefix already covers everything (``warm_frames``)."""
        frames = self.warm_frames()
        if not frames:
            return None
        self.buffer.pin(frames)
        return WarmStep(frames, self.warm_prompt(frames))

    def next_caption(self, question: str, tokens: int, at_ms: float) -> CaptionStep | None:
        """A caption's job over the timeline brought up to date (its frames pinned until
        ``captioned``), or None when it holds no frame."""
        self.timeline.forget_evicted()
        self.timeline.admit(self.buffer.frames)
        frames = self.timeline.frames
        if not frames:
            return None
        self.buffer.pin(frames)
        return CaptionStep(frames, self._render(question), at_ms, tokens)

    def captioned(self, step: CaptionStep) -> None:
        self.buffer.unpin(step.frames)

    def warmed(self, step: WarmStep, done: bool = True) -> None:
        """A prefill ended (``done``: ran to the end; else failed or stopped by a question): its
        frames may go; a prefill of the next window counts for the slide (``window_slide``)."""
        self.buffer.unpin(step.frames)
        if step.slide:
            self.slide_warmed(step, done)
