"""Sliding the window of an engine that cannot move a warm prefix (vLLM, a remote server): the
next window is warmed before the session switches to it (``SessionCore`` inherits this). Pure.

Such an engine caches a prompt from its start: once the oldest frames leave, everything after
them is computed again. Without a slide, a question or a check that comes right after an
eviction waits for that. With one:

- when the buffer is ``slide_margin`` frames from full, a slide starts: the frames from the
  middle of the window on are the ones its half-window eviction will keep;
- between the session's own prefills and watch checks, the next window's prompt (the timeline as
  it will be once the older frames have gone, with every frame buffered since) is prefilled,
  and again as frames come; the engine's prefix cache keeps it while questions and checks still
  go to the current window, which is warm;
- the frame that finds the buffer full evicts the older half, as without a slide, once the
  next window is warm through the newest frame; until then the buffer holds up to
  ``slide_margin`` frames more (never more than the engine's ``max_images``), so the switch
  lands on a warm prompt. A slide still not warm at that bound switches anyway, on what its
  last finished prefill covered.

Each frame kept by a slide is prefilled twice (once in each window); an engine that shifts its
prefix (``Capabilities.shifts_prefix``) evicts one frame at a time instead and needs none of this.
"""

from __future__ import annotations

from dataclasses import dataclass

from handlers.core.frames import Frame
from handlers.core.jobs import WarmStep


@dataclass
class Slide:
    """A slide under way: the first frame the next window keeps; the newest frame a finished
    prefill of the next window covered (seq, -1: none yet) and the one a running prefill covers."""

    first_kept: Frame
    warmed_through: int = -1
    running_through: int = -1
    tried_through: int = -1  # the newest frame a prefill that did not finish covered: tried again with newer ones


class WindowSlide:
    """The core's window slides (its state: ``slide``, and ``buffer``, ``timeline``)."""

    slide: Slide | None = None

    @property
    def slides_window(self) -> bool:
        """True when this session slides its window (a warm prefix the engine cannot move)."""
        return self.warm_prefix and not self.capabilities.shifts_prefix

    def slide_margin(self) -> int:
        """How many frames before the window is full a slide starts."""
        return max(1, self.buffer.max_frames // 8)

    def plan_slide(self, evicted: bool) -> None:
        """After a frame was buffered: a slide ends when the buffer evicted its older half (the
        next window is then the current one), and starts when the window is within the margin of
        full: the frames it will keep are those from the middle of the full window on."""
        if evicted:
            self.slide = None
        if self.slide is not None or not self.slides_window:
            return
        frames, half = self.buffer.frames, max(1, self.buffer.max_frames // 2)
        if len(frames) > half and len(frames) >= self.buffer.max_frames - self.slide_margin():
            self.slide = Slide(frames[half])

    def slide_hold(self) -> int:
        """Frames the buffer may take past ``max_frames`` before its eviction: none unless a
        slide's next window is not warm through the newest frame yet; then up to the margin,
        within the engine's image limit."""
        slide, latest = self.slide, self.buffer.latest
        if slide is None or latest is None or slide.warmed_through >= latest.seq:
            return 0
        room = self.slide_margin()
        if self.capabilities.max_images is not None:
            room = min(room, self.capabilities.max_images - self.buffer.max_frames)
        return max(0, room)

    def next_slide_warm(self) -> WarmStep | None:
        """A prefill of the next window when frames came since its last one (its frames pinned
        until ``warmed``), else None."""
        slide = self.slide
        if slide is None:
            return None
        if not slide.first_kept.in_window:
            self.slide = None
            return None
        timeline = self.timeline.from_frame(slide.first_kept)
        timeline.admit(self.buffer.frames)
        frames = timeline.frames
        if not frames or frames[-1].seq <= max(slide.warmed_through, slide.tried_through):
            return None
        slide.running_through = frames[-1].seq
        self.buffer.pin(frames)
        return WarmStep(frames, self._render(None, timeline=timeline), slide=True)

    def slide_warmed(self, step: WarmStep, done: bool) -> None:
        """A prefill of the next window ended; when it ran to the end, its frames are warm there."""
        if self.slide is None:
            return
        if done:
            self.slide.warmed_through = max(self.slide.warmed_through, self.slide.running_through)
        else:  # failed or stopped by a question: not again before a new frame comes
            self.slide.tried_through = max(self.slide.tried_through, self.slide.running_through)
