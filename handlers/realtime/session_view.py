"""A Realtime session's settings both ways: ``session.update`` as the core's config changes,
and the session as ``session.created`` / ``session.updated`` show it.

The core keeps the session's config; this keeps only what Realtime has and the core has
not: the audio formats, the transcription and noise reduction asked for (echoed, not acted
on), which VAD the client asked for (``semantic_vad`` is served by the server's VAD), and the
last update's notes, refused parts and ignored fields.
"""

from __future__ import annotations

import uuid
from typing import Any

from handlers.core.events import ConfigUpdated, SessionReady
from handlers.realtime import client_events as rtc
from handlers.realtime import server_events as rt
from handlers.wire.client_events import TurnDetection, TurnDetectionChange
from handlers.wire.fields import LIVESIGHT_FIELDS, MAX_ANSWER_TOKENS


def core_modalities(output_modalities: list[str]) -> list[str]:
    """Realtime's ``["audio"]`` (speech with its transcript) is the core's ``["text", "audio"]``."""
    return ["text", "audio"] if "audio" in output_modalities else ["text"]


def max_tokens(value: int | str) -> int:
    """Realtime's ``"inf"`` is the most an answer may ask for (the core lowers it to its limit)."""
    return MAX_ANSWER_TOKENS if value == "inf" else max(1, int(value))


class SessionView:
    """One Realtime session's settings as its client set them and as the server serves them."""

    def __init__(self, model: str | None) -> None:
        self.model = model
        self.session_id = f"sess_{uuid.uuid4().hex[:20]}"
        self.in_format = rtc.AudioFormat()
        self.out_format = rtc.AudioFormat()
        self.transcription: dict[str, Any] | None = None
        self.noise_reduction: dict[str, Any] | None = None
        self.config: dict[str, Any] = {}  # the core's effective configuration
        self.vad_type = "server_vad"  # what the client asked for (semantic_vad is served by server VAD)
        self.eagerness: str = "auto"
        self.refused: list[str] = []  # the last session.update's parts that were not applied
        self.notes: list[str] = []  # what the server changed of what was asked (the core's notes)
        self.ignored: list[str] = []  # the last session.update's fields this server does not know

    # ------------------------------------------------------------------ client -> core
    def changes(self, session: rtc.RealtimeSession) -> dict[str, Any]:
        """A ``session.update``'s session as the core's config changes (what only Realtime
        has is kept here)."""
        changes: dict[str, Any] = {}
        given = session.model_fields_set
        if "instructions" in given:
            changes["system_prompt"] = session.instructions or None
        if session.output_modalities is not None:
            changes["modalities"] = core_modalities(session.output_modalities)
        if session.max_output_tokens is not None:
            sampling = self.config.get("sampling", {})
            changes["sampling"] = {**sampling, "max_tokens": max_tokens(session.max_output_tokens)}
        audio = session.audio or rtc.SessionAudio()
        if audio.input is not None:
            if audio.input.format is not None:
                self.in_format = audio.input.format
            if "transcription" in audio.input.model_fields_set:
                self.transcription = audio.input.transcription
            if "noise_reduction" in audio.input.model_fields_set:
                self.noise_reduction = audio.input.noise_reduction
            if "turn_detection" in audio.input.model_fields_set:
                changes["turn_detection"] = self._turn_detection(audio.input.turn_detection)
        if audio.output is not None:
            if audio.output.format is not None:
                self.out_format = audio.output.format
            if audio.output.voice is not None:
                changes["voice"] = audio.output.voice
            if audio.output.speed is not None:
                changes["speech_rate"] = min(2.0, max(0.5, audio.output.speed))
        if session.livesight is not None:
            changes.update(session.livesight.model_dump(exclude_unset=True))
        return changes

    def _turn_detection(self, vad: rtc.ServerVad | rtc.SemanticVad | None) -> dict[str, Any] | None:
        """Turn detection as the core's: ``semantic_vad`` is the server's VAD with the silence
        its eagerness asks for (``SEMANTIC_SILENCE_MS``)."""
        if vad is None:
            return None
        self.vad_type = vad.type
        answers = {"create_response": vad.create_response, "interrupt_response": vad.interrupt_response}
        if isinstance(vad, rtc.SemanticVad):
            self.eagerness = vad.eagerness or "auto"
            change = TurnDetectionChange(silence_ms=rtc.SEMANTIC_SILENCE_MS[self.eagerness], **answers)
        else:
            change = TurnDetectionChange(
                threshold=vad.threshold, silence_ms=vad.silence_duration_ms, prefix_padding_ms=vad.prefix_padding_ms,
                idle_timeout_ms=vad.idle_timeout_ms, **answers,
            )
        return change.as_config()

    # ------------------------------------------------------------------ core -> client
    def ready(self, event: SessionReady) -> rt.SessionOut:
        """The session as ``session.created`` shows it."""
        self.config, self.notes = event.config, event.notes
        return self.out()

    def updated(self, event: ConfigUpdated) -> rt.SessionOut:
        """The session as ``session.updated`` shows it after a ``session.update``."""
        self.config = event.config
        self.refused, self.notes, self.ignored = event.refused, event.notes, event.ignored
        return self.out()

    def out(self) -> rt.SessionOut:
        """The session as the server serves it."""
        config = self.config
        return rt.SessionOut(
            id=self.session_id,
            model=str(config.get("model") or self.model or ""),
            instructions=config.get("system_prompt") or "",
            output_modalities=["audio"] if "audio" in config.get("modalities", ["text"]) else ["text"],
            max_output_tokens=self.max_output_tokens(),
            audio=rt.SessionAudioOut(
                input=rt.AudioInputOut(
                    format=self.in_format,
                    turn_detection=self._vad_out(config.get("turn_detection")),
                    transcription=self.transcription,
                    noise_reduction=self.noise_reduction,
                ),
                output=rt.AudioOutputOut(
                    format=self.out_format, voice=config.get("voice"), speed=config.get("speech_rate", 1.0)
                ),
            ),
            livesight={**{name: config.get(name) for name in LIVESIGHT_FIELDS},
                       "notes": self.notes, "refused": self.refused, "ignored": self.ignored},
        )

    def _vad_out(self, config: dict[str, Any] | None) -> rt.ServerVadOut | rt.SemanticVadOut | None:
        if config is None:
            return None
        vad = TurnDetection.model_validate(config)
        if self.vad_type == "semantic_vad":
            return rt.SemanticVadOut(
                eagerness=self.eagerness, create_response=vad.create_response, interrupt_response=vad.interrupt_response
            )
        return rt.ServerVadOut(
            threshold=vad.threshold, prefix_padding_ms=vad.prefix_padding_ms, silence_duration_ms=vad.silence_ms,
            create_response=vad.create_response, interrupt_response=vad.interrupt_response,
            idle_timeout_ms=vad.idle_timeout_ms,
        )

    def max_output_tokens(self) -> int:
        """The answers' token limit as the server serves it."""
        return int(self.config.get("sampling", {}).get("max_tokens", 0)) or 1

    def conversation_id(self, in_conversation: bool = True) -> str | None:
        """The session's one conversation (None for an answer out of band)."""
        return f"conv_{self.session_id[5:]}" if in_conversation else None
