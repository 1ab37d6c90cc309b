"""Which voice stages a server runs: settings -> ``Voice``."""

from __future__ import annotations

from server.settings import Settings
from server.speech.base import SpeechError, Voice


def create_voice(settings: Settings) -> Voice:
    """The stages ``settings`` ask for (not started). Raises ``SpeechError`` for a remote stage
    without its URL."""
    voice = Voice(
        max_sentence_chars=settings.speech_max_sentence_chars,
        max_pending_sentences=settings.speech_max_pending_sentences,
        sentence_pause_ms=settings.speech_sentence_pause_ms,
        native_trim_ms=settings.native_audio_trim_ms,
    )
    if settings.speech == "espeak":
        from server.speech.espeak import EspeakSynthesizer

        voice.synthesizer = EspeakSynthesizer(settings.speech_voice)
    elif settings.speech == "openai":
        from server.speech.remote import RemoteSynthesizer

        if not settings.speech_url:
            raise SpeechError("speech=openai needs speech_url")
        voice.synthesizer = RemoteSynthesizer(
            settings.speech_url, settings.speech_model, settings.speech_voice, _secret(settings.speech_api_key),
            settings.voice_timeout_s, settings.speech_workers,
        )
    if settings.transcription == "pocketsphinx":
        from server.speech.pocketsphinx_asr import PocketsphinxTranscriber

        voice.transcriber = PocketsphinxTranscriber(settings.transcription_workers)
    elif settings.transcription == "openai":
        from server.speech.remote import RemoteTranscriber

        if not settings.transcription_url:
            raise SpeechError("transcription=openai needs transcription_url")
        voice.transcriber = RemoteTranscriber(
            settings.transcription_url, settings.transcription_model, _secret(settings.transcription_api_key),
            settings.voice_timeout_s, settings.transcription_workers, settings.transcription_language,
        )
    if settings.server_vad:
        from server.speech.silero import SileroVad

        voice.vad = SileroVad()
    return voice


def _secret(value: object) -> str | None:
    return None if value is None else value.get_secret_value()
