"""Remote voice stages: any OpenAI-compatible server's ``/v1/audio/speech`` and
``/v1/audio/transcriptions`` (vLLM serves Whisper models; many servers serve TTS).

Requests are plain HTTP through one ``httpx.AsyncClient`` per stage, at most ``concurrency``
at a time. HTTP and format failures become ``SpeechError``.
"""

from __future__ import annotations

import anyio
import httpx

from server.speech.base import SpeechError, Synthesizer, Transcriber
from server.speech.wav import INPUT_RATE, OUTPUT_RATE, encode_wav, parse_wav, resample


class _Remote:
    def __init__(
        self, url: str, model: str, api_key: str | None, timeout_s: float, concurrency: int,
        transport: httpx.AsyncBaseTransport | None,
    ) -> None:
        self.base = url.rstrip("/")
        if not self.base.endswith("/v1"):
            self.base += "/v1"
        self.model = model
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._timeout_s = timeout_s
        self._concurrency = concurrency
        self._transport = transport
        self._client: httpx.AsyncClient | None = None
        self._limiter: anyio.CapacityLimiter | None = None

    async def start(self) -> None:
        self._limiter = anyio.CapacityLimiter(self._concurrency)
        self._client = httpx.AsyncClient(headers=self._headers, timeout=self._timeout_s, transport=self._transport)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def post(self, path: str, **kwargs: object) -> httpx.Response:
        if self._client is None or self._limiter is None:
            raise SpeechError("the remote voice stage is not started")
        async with self._limiter:
            try:
                response = await self._client.post(self.base + path, **kwargs)
                response.raise_for_status()
            except httpx.HTTPStatusError as exc:
                raise SpeechError(f"{path} answered HTTP {exc.response.status_code}") from exc
            except httpx.HTTPError as exc:
                raise SpeechError(f"{path} failed: {type(exc).__name__}") from exc
        return response


class RemoteSynthesizer(Synthesizer):
    """``POST /v1/audio/speech`` (WAV asked for, resampled to 24 kHz when it is not)."""

    name = "openai"

    def __init__(
        self, url: str, model: str, default_voice: str | None, api_key: str | None = None,
        timeout_s: float = 30.0, concurrency: int = 4, transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.default_voice = default_voice or "alloy"
        self._remote = _Remote(url, model, api_key, timeout_s, concurrency, transport)

    async def start(self) -> None:
        await self._remote.start()

    async def close(self) -> None:
        await self._remote.close()

    async def synthesize(self, text: str, voice: str, rate: float) -> bytes:
        response = await self._remote.post(
            "/audio/speech",
            json={
                "model": self._remote.model, "input": text, "voice": voice,
                "response_format": "wav", "speed": rate,
            },
        )
        try:
            pcm = parse_wav(response.content)
        except ValueError as exc:
            raise SpeechError(f"/audio/speech returned no usable WAV: {exc}") from exc
        return resample(pcm, OUTPUT_RATE).samples


class RemoteTranscriber(Transcriber):
    """``POST /v1/audio/transcriptions`` with the question as a 16 kHz WAV file."""

    name = "openai"

    def __init__(
        self, url: str, model: str, api_key: str | None = None, timeout_s: float = 30.0, concurrency: int = 4,
        language: str | None = None, transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._remote = _Remote(url, model, api_key, timeout_s, concurrency, transport)
        self._language = language

    async def start(self) -> None:
        await self._remote.start()

    async def close(self) -> None:
        await self._remote.close()

    async def transcribe(self, pcm16: bytes) -> str:
        fields = {"model": self._remote.model, "response_format": "json"}
        if self._language:
            fields["language"] = self._language
        response = await self._remote.post(
            "/audio/transcriptions",
            data=fields,
            files={"file": ("question.wav", encode_wav(pcm16, INPUT_RATE), "audio/wav")},
        )
        try:
            text = response.json().get("text", "")
        except (ValueError, AttributeError) as exc:
            raise SpeechError("/audio/transcriptions returned no JSON text") from exc
        if not isinstance(text, str):
            raise SpeechError("/audio/transcriptions returned no JSON text")
        return text.strip()
