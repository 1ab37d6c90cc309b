"""The frame buffer: window eviction, pinning, release, decoded-image reuse, leak count."""

from __future__ import annotations

import gc

import pytest
import numpy as np

from handlers.media.frame_image import FrameImage
from handlers.core.frames import Frame, FrameBuffer, content_key, live_frame_count


def make_frame(seq: int, payload: bytes | None = None, *, image: bool = False) -> Frame:
    data = payload if payload is not None else f"frame-{seq}".encode()
    frame = Frame(seq=seq, key=content_key(data), data=data, receive_ts_ms=1000.0 + seq)
    if image:
        frame.image = FrameImage.decoded(np.zeros((4, 4, 3), np.uint8))
    return frame


def fill(buffer: FrameBuffer, count: int, *, start: int = 0) -> list[Frame]:
    frames = [make_frame(seq) for seq in range(start, start + count)]
    for frame in frames:
        buffer.add(frame)
    return frames


def test_content_key_is_a_32_hex_digit_hash_of_the_bytes() -> None:
    """Equal bytes give equal keys, different bytes different keys, 32 hex digits."""
    key = content_key(b"abc")
    assert key == content_key(b"abc")
    assert key != content_key(b"abd")
    assert len(key) == 32
    int(key, 16)


def test_add_below_capacity_evicts_nothing() -> None:
    """Frames are kept oldest first until the window is full."""
    buffer = FrameBuffer(3)
    frames = [make_frame(seq) for seq in range(3)]
    assert [buffer.add(frame) for frame in frames] == [[], [], []]
    assert buffer.frames == frames
    assert len(buffer) == 3
    assert buffer.latest is frames[-1]


def test_full_window_evicts_the_oldest_frame_and_releases_it() -> None:
    """By default a full window drops exactly its oldest frame, which loses its data."""
    buffer = FrameBuffer(3)
    frames = fill(buffer, 3)
    frames[0].image = FrameImage.decoded(np.zeros((4, 4, 3), np.uint8))
    newest = make_frame(3)
    evicted = buffer.add(newest)
    assert evicted == [frames[0]]
    assert frames[0].released and frames[0].image is None and not frames[0].in_window
    assert buffer.frames == [frames[1], frames[2], newest]
    assert buffer.evicted_total == 1


def test_bulk_eviction_drops_the_oldest_half_at_once() -> None:
    """With bulk eviction a full window drops its oldest half, then fills up again."""
    buffer = FrameBuffer(4)
    buffer.bulk_eviction = True
    frames = fill(buffer, 4)
    evicted = buffer.add(make_frame(4))
    assert evicted == frames[:2]
    assert all(frame.released for frame in evicted)
    assert [frame.seq for frame in buffer.frames] == [2, 3, 4]
    assert buffer.add(make_frame(5)) == []
    assert [frame.seq for frame in buffer.add(make_frame(6))] == [2, 3]
    assert buffer.evicted_total == 4


def test_bulk_eviction_of_a_one_frame_window_drops_one() -> None:
    """Half of a one-frame window still evicts that one frame."""
    buffer = FrameBuffer(1)
    buffer.bulk_eviction = True
    first = make_frame(0)
    buffer.add(first)
    assert buffer.add(make_frame(1)) == [first]
    assert len(buffer) == 1


def test_pinned_frame_survives_eviction_until_its_last_unpin() -> None:
    """A pinned frame keeps bytes and image out of the window; the last unpin releases it."""
    buffer = FrameBuffer(2)
    frames = fill(buffer, 2)
    frames[0].image = FrameImage.decoded(np.zeros((4, 4, 3), np.uint8))
    buffer.pin([frames[0]])
    buffer.pin([frames[0]])
    assert buffer.add(make_frame(2)) == [frames[0]]
    assert not frames[0].in_window
    assert frames[0].data is not None and frames[0].image is not None
    assert buffer.retained == 3
    buffer.unpin([frames[0]])
    assert not frames[0].released
    buffer.unpin([frames[0]])
    assert frames[0].released and frames[0].image is None
    assert buffer.retained == 2


def test_unpin_of_a_frame_still_in_the_window_keeps_it() -> None:
    """Unpinning a frame that is still in the window does not release it."""
    buffer = FrameBuffer(3)
    frames = fill(buffer, 2)
    buffer.pin(frames)
    buffer.unpin(frames)
    assert not any(frame.released for frame in frames)
    assert buffer.frames == frames


def test_pin_rejects_released_frames_and_unpin_rejects_unpinned_ones() -> None:
    """Pinning a released frame or unpinning an unpinned one is an error that changes nothing."""
    buffer = FrameBuffer(1)
    old, live = make_frame(0), make_frame(1)
    buffer.add(old)
    buffer.add(live)
    with pytest.raises(ValueError):
        buffer.pin([live, old])
    assert live.pins == 0
    buffer.pin([live])
    with pytest.raises(ValueError):
        buffer.unpin([live, make_frame(9)])
    assert live.pins == 1


def test_remove_takes_a_frame_out_and_releases_it() -> None:
    """A removed frame (failed decode) leaves the window and is released."""
    buffer = FrameBuffer(3)
    frames = fill(buffer, 3)
    assert buffer.remove(frames[1]) is True
    assert frames[1].released
    assert buffer.frames == [frames[0], frames[2]]
    assert buffer.remove(frames[1]) is False
    assert buffer.add(make_frame(3)) == []


def test_remove_of_a_pinned_frame_waits_for_unpin() -> None:
    """A removed frame that is pinned keeps its data until unpinned."""
    buffer = FrameBuffer(3)
    (frame,) = fill(buffer, 1)
    buffer.pin([frame])
    buffer.remove(frame)
    assert len(buffer) == 0 and not frame.released
    buffer.unpin([frame])
    assert frame.released


def test_close_releases_everything_pinned_or_not() -> None:
    """Closing the buffer releases window frames and pinned evicted frames alike."""
    buffer = FrameBuffer(2)
    frames = fill(buffer, 3)
    buffer.pin([frames[1]])
    buffer.close()
    assert all(frame.released for frame in frames)
    assert len(buffer) == 0 and buffer.retained == 0
    buffer.unpin([frames[1]])
    assert frames[1].pins == 0


def test_ready_frames_are_the_decoded_ones() -> None:
    """Only frames with an image count as ready, oldest first."""
    buffer = FrameBuffer(4)
    frames = fill(buffer, 3)
    frames[0].image = FrameImage.decoded(np.zeros((4, 4, 3), np.uint8))
    frames[2].image = FrameImage.decoded(np.zeros((4, 4, 3), np.uint8))
    assert buffer.ready_frames() == [frames[0], frames[2]]


def test_decoded_image_is_found_by_content_key_among_live_frames() -> None:
    """An identical frame finds the image already decoded, while its owner is live."""
    buffer = FrameBuffer(2)
    first = make_frame(0, b"same", image=True)
    buffer.add(first)
    assert buffer.decoded_image(content_key(b"same")) is first.image
    assert buffer.decoded_image(content_key(b"other")) is None
    buffer.add(make_frame(1))
    buffer.add(make_frame(2))
    assert first.released
    assert buffer.decoded_image(content_key(b"same")) is None


def test_decoded_image_is_found_on_a_pinned_evicted_frame() -> None:
    """A pinned frame out of the window still lends its image to identical frames."""
    buffer = FrameBuffer(1)
    first = make_frame(0, b"same", image=True)
    buffer.add(first)
    buffer.pin([first])
    buffer.add(make_frame(1))
    assert buffer.decoded_image(first.key) is first.image


def test_add_rejects_released_frames_and_non_increasing_seq() -> None:
    """Frames must be live and arrive in strictly increasing seq order."""
    buffer = FrameBuffer(3)
    buffer.add(make_frame(5))
    with pytest.raises(ValueError):
        buffer.add(make_frame(5))
    released = make_frame(6)
    released.release()
    with pytest.raises(ValueError):
        buffer.add(released)


def test_max_frames_must_be_positive() -> None:
    """A window of zero frames is refused."""
    with pytest.raises(ValueError):
        FrameBuffer(0)


def test_live_frame_count_drops_to_zero_once_frames_are_released() -> None:
    """The process-wide leak check counts frames until they are released or collected."""
    gc.collect()
    before = live_frame_count()
    buffer = FrameBuffer(2)
    frames = fill(buffer, 2)
    buffer.pin([frames[0]])
    fill(buffer, 1, start=2)
    assert live_frame_count() == before + 3
    buffer.unpin([frames[0]])
    assert live_frame_count() == before + 2
    buffer.close()
    assert live_frame_count() == before
