"""Frame intake: what a frame costs before it is buffered, and what bounds that cost.

- ``IntakeLimits``: the intake settings a session applies (read-ahead bytes, shedding
  deadline, image checks before decoding).
- ``ReadAhead``: bytes read from clients but not yet handled, counted for the whole server
  (each session also counts its own); a frame that does not fit is shed, not queued.
- ``Admission``: session slots, and the separate, bounded pool of connections that have not
  sent ``session.config`` yet, so silent connections cannot take the slots of real clients.
- ``prepare_frame`` (blocking, run on the image pool): base64, content hash, header check,
  then the frame's picture (``frame_image.py``): a plain JPEG is kept encoded and decoded
  at 1/8 scale for the similarity thumbnail; any other image is decoded once, at the size
  the model needs, and its thumbnail taken from those pixels. A heavy image stops after the
  header check (``PreparedFrame.image`` is None) and is finished by ``decode_prepared`` on
  the smaller heavy pool.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, replace

import anyio
import numpy as np
from PIL import Image

from handlers.core.session_core import decode_base64
from handlers.media.decoder import (
    ImageHeader,
    check_size,
    decode_jpeg_reduced,
    decode_opened,
    open_image,
    plain_jpeg_size,
    sniff_format,
    turbo_decodable,
)
from handlers.wire.errors import ErrorCode, SessionError
from handlers.media.frame_image import FrameImage
from handlers.core.frames import content_key
from handlers.core.similarity import THUMBNAIL_SIDE, NormalisedThumbnail, normalised_thumbnail

MiB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class IntakeLimits:
    """Per-session intake limits (defaults match ``Settings``)."""

    max_read_ahead_bytes: int = 32 * MiB
    intake_max_wait_ms: float = 25.0
    max_image_pixels: int = 3840 * 2160
    max_image_aspect_ratio: float = 20.0
    heavy_image_pixels: int = 1920 * 1080

    def is_heavy(self, header: ImageHeader) -> bool:
        """True for an image whose decode costs several times a webcam frame's: very large,
        or a PNG/WebP above a quarter of the limit (no reduced-scale decode for those)."""
        if header.format != "jpeg":
            return header.pixels > self.heavy_image_pixels // 4
        return header.pixels > self.heavy_image_pixels


class ReadAhead:
    """A byte budget for messages read but not yet handled (whole server)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def take(self, size: int) -> bool:
        """Reserve ``size`` bytes; False (nothing reserved) when they do not fit."""
        if self.used + size > self.limit:
            return False
        self.used += size
        return True

    def give(self, size: int) -> None:
        """Return bytes reserved by ``take``."""
        self.used = max(0, self.used - size)


#: New connections set up at once (handshake, then ``session.config`` to ``session.ready``).
SETUP_CONCURRENCY = 2


class Admission:
    """Session slots, the pool of connections still waiting for ``session.config``, and the
    turns new connections take to be set up.

    A connection waits in the pool (at most ``max_pending``; when it is full, the one that
    waited longest is pushed out) and claims a session slot only with a valid config.

    Setting a connection up (the WebSocket handshake, then the config's checks and
    ``session.ready``) runs on the event loop, ~2 ms each; a reconnect storm of a hundred
    connections all set up at once took every loop turn for a quarter of a second and
    delayed the acks of sessions already streaming by up to 168 ms. ``setting_up`` lets
    ``setups`` run at a time, so streaming sessions get the loop between them
    (``livesight bench storm``: 17-72 ms at worst).
    Waiting for the client's config is not a setup step: a silent client holds no turn.
    """

    def __init__(self, max_sessions: int, max_pending: int, setups: int = SETUP_CONCURRENCY) -> None:
        self.max_sessions = max_sessions
        self.max_pending = max_pending
        self.active: set[str] = set()
        self._pending: OrderedDict[str, anyio.CancelScope] = OrderedDict()
        self.pushed_out: set[str] = set()
        self._setups = anyio.Semaphore(setups)

    @asynccontextmanager
    async def setting_up(self) -> AsyncIterator[None]:
        """Hold one of the setup turns (see the class docstring)."""
        async with self._setups:
            yield

    @property
    def pending(self) -> int:
        return len(self._pending)

    @contextmanager
    def waiting(self, key: str) -> Iterator[anyio.CancelScope]:
        """Hold a place in the pending pool while the config is awaited; the yielded scope
        is cancelled when a newer connection pushes this one out (see ``pushed_out``)."""
        while len(self._pending) >= self.max_pending:
            oldest, scope = self._pending.popitem(last=False)
            self.pushed_out.add(oldest)
            scope.cancel()
        scope = anyio.CancelScope()
        self._pending[key] = scope
        try:
            with scope:
                yield scope
        finally:
            self._pending.pop(key, None)

    def was_pushed_out(self, key: str) -> bool:
        """True (once) when ``key`` lost its pending place to a newer connection."""
        if key in self.pushed_out:
            self.pushed_out.discard(key)
            return True
        return False

    def claim(self, key: str) -> bool:
        """Take a session slot; False when every slot is taken."""
        if len(self.active) >= self.max_sessions:
            return False
        self.active.add(key)
        return True

    def release(self, key: str) -> None:
        """Give back the slot (and any pending place) of ``key``."""
        self.active.discard(key)
        self.pushed_out.discard(key)


@dataclass(frozen=True, slots=True)
class PreparedFrame:
    """A frame's bytes, identity and header; its picture and thumbnail once checked."""

    raw: bytes
    key: str
    header: ImageHeader
    heavy: bool
    image: FrameImage | None = None
    thumb: NormalisedThumbnail | None = None
    decode_ms: float | None = None  # the intake decode: the thumbnail's, or the whole image's


def prepare_frame(data: str, frame_id: str | int | None, limits: IntakeLimits, max_side: int | None) -> PreparedFrame:
    """Blocking: base64, content key, header check and (unless heavy) the frame's picture.

    A plain JPEG (``decoder.plain_jpeg_size``) is checked from libjpeg-turbo's reading of
    its header and never reaches Pillow; any other image is opened once by Pillow, its
    header checked, then (unless heavy) the same opened image is decoded.

    Raises:
        SessionError: ``invalid_image`` for bad base64, an undecodable image, or one over
            the pixel or aspect-ratio limit (checked before any pixel is decoded).
    """
    raw = decode_base64(data, ErrorCode.INVALID_IMAGE, "frame data", frame_id)
    size = plain_jpeg_size(raw)
    if size is not None:
        try:
            check_size(size, max_pixels=limits.max_image_pixels, max_aspect_ratio=limits.max_image_aspect_ratio)
        except ValueError as exc:
            raise _refused(exc, frame_id, False) from None
        header = ImageHeader("jpeg", *size)
        prepared = PreparedFrame(raw, content_key(raw), header, limits.is_heavy(header))
        if prepared.heavy:
            return prepared  # finished by ``decode_prepared`` on the heavy pool
        encoded = _kept_encoded(prepared, max_side)
        if encoded is not None:
            return encoded
    return _opened(raw, frame_id, limits, max_side, heavy_later=True, keep_encoded=size is None)


def decode_prepared(
    prepared: PreparedFrame, frame_id: str | int | None, limits: IntakeLimits, max_side: int | None
) -> PreparedFrame:
    """Blocking: ``prepare_frame``'s picture and thumbnail for a heavy image.

    Raises:
        SessionError: ``invalid_image`` when the pixels cannot be decoded.
    """
    plain = plain_jpeg_size(prepared.raw) is not None
    if plain:
        encoded = _kept_encoded(prepared, max_side)
        if encoded is not None:
            return encoded
    return _opened(prepared.raw, frame_id, limits, max_side, heavy_later=False, keep_encoded=not plain)


def _opened(
    raw: bytes, frame_id: str | int | None, limits: IntakeLimits, max_side: int | None, *, heavy_later: bool,
    keep_encoded: bool,
) -> PreparedFrame:
    """The frame read by Pillow: header checked, then (unless heavy and ``heavy_later``) its
    picture. ``keep_encoded`` False: its reduced decode already failed, so it is decoded in
    full. Raises ``SessionError`` (``invalid_image``)."""
    checked = False
    try:
        with open_image(raw, max_pixels=limits.max_image_pixels, max_aspect_ratio=limits.max_image_aspect_ratio) as img:
            checked = True
            header = ImageHeader(sniff_format(raw) or "", *img.size)
            prepared = PreparedFrame(raw, content_key(raw), header, limits.is_heavy(header))
            if prepared.heavy and heavy_later:
                return prepared  # finished by ``decode_prepared`` on the heavy pool
            return _with_picture(prepared, img, max_side, keep_encoded)
    except ValueError as exc:
        raise _refused(exc, frame_id, checked) from None


def _kept_encoded(prepared: PreparedFrame, max_side: int | None) -> PreparedFrame | None:
    """A plain JPEG kept encoded, with the thumbnail of its 1/8-scale decode; None when
    libjpeg-turbo warns (Pillow then decides)."""
    started = time.perf_counter()
    size = (prepared.header.width, prepared.header.height)
    try:
        small = decode_jpeg_reduced(prepared.raw, size, THUMBNAIL_SIDE)
    except ValueError:
        return None
    return _finished(prepared, FrameImage.encoded(prepared.raw, size, max_side), small, started)


def _with_picture(prepared: PreparedFrame, img: Image.Image, max_side: int | None, keep_encoded: bool) -> PreparedFrame:
    """The prepared frame with its picture and its similarity thumbnail, for an image opened
    by Pillow: a plain JPEG stays encoded (``_kept_encoded``, unless ``keep_encoded`` is
    False); anything else, or a JPEG libjpeg-turbo warns about, is decoded once, at
    ``max_side``. Raises what the decoders raise (``open_image`` makes it ``ValueError``)."""
    if keep_encoded and turbo_decodable(img):
        encoded = _kept_encoded(prepared, max_side)
        if encoded is not None:
            return encoded
    started = time.perf_counter()
    pixels = decode_opened(img, prepared.raw, max_side)
    return _finished(prepared, FrameImage.decoded(pixels), pixels, started)


def _finished(prepared: PreparedFrame, picture: FrameImage, pixels: np.ndarray, started: float) -> PreparedFrame:
    """The prepared frame with its picture and the similarity thumbnail of ``pixels``
    (normalised here, off the event loop)."""
    thumb = normalised_thumbnail(pixels)
    return replace(prepared, image=picture, thumb=thumb, decode_ms=round((time.perf_counter() - started) * 1000, 3))


def _refused(exc: ValueError, frame_id: str | int | None, checked: bool) -> SessionError:
    fid = None if frame_id is None else str(frame_id)
    if not checked:
        return SessionError(ErrorCode.INVALID_IMAGE, f"image refused: {exc}", frame_id=fid)
    return SessionError(ErrorCode.INVALID_IMAGE, f"image could not be decoded: {exc}", frame_id=fid)
