"""The core's decisions, as tables through ``run_core``: inputs and job results in, effects out."""

from __future__ import annotations

import io
import wave

import numpy as np
import pytest

from handlers.core import events as ev
from handlers.core.effects import (
    Check,
    FrameShed,
    Handle,
    ListenFeed,
    ListenStart,
    Now,
    Prefill,
    Read,
    ResetVad,
    Send,
    SpeechDetected,
    Tick,
    Timer,
    TranscribeHeld,
)
from handlers.core.machine import Source
from handlers.core.negotiation import VoicePaths
from handlers.wire.commands import AnswerRequest, CancelRequest, ClearOutputAudio, ConfigUpdate, UserInput
from handlers.wire.protocol import VideoFrame
from tests.core.run_core import At, Checks, End, Reply, Warm, ask, client, frame, machine, run_core, said
from tests.protocol_client import b64

RED = {"watch_id": "red", "condition": "Is the screen red?", "mode": "alert"}
#: A turn detector's voice paths: speech comes in windows of 512 samples.
HEARS = VoicePaths(input="pocketsphinx", vad_window=512)


def answering() -> list[object]:
    """A session with one frame warmed and one answer running."""
    return [frame(1, "f1"), Warm(), *ask("first?")]


# ------------------------------------------------------------------ interruptions
@pytest.mark.parametrize(
    ("event", "expected"),
    [
        (client(type="response.cancel"), ["stop answer:cancel"]),
        (client(type="video.query", text="next?"), ["stop answer:question"]),
        (AnswerRequest(exclusive=False), ["stop answer:question"]),
        (AnswerRequest(exclusive=True), []),
        (ClearOutputAudio(), ["stop answer:cancel"]),
        (CancelRequest(), ["stop answer:cancel"]),
        (client(type="ping"), ["send Pong"]),
        (client(type="video.done"), []),
    ],
)
def test_what_a_message_read_during_an_answer_stops(event: object, expected: list[str]) -> None:
    """Read while an answer runs: cancels and new questions stop it at once, each with its
    cause; an exclusive request, a ping or video.done leave it running."""
    run = run_core(answering())
    assert said(run.core.receive(Read(event), _now())) == expected


def test_speech_that_starts_stops_the_answer_unless_interrupt_response_is_off() -> None:
    """Barge-in: speech starting stops the running answer (cause speech), unless turn detection
    says answers are not interrupted."""
    for interrupt, expected in ((True, ["send SpeechBegan", "stop answer:speech"]),
                                (False, ["send SpeechBegan"])):
        core = machine(voice=HEARS, turn_detection={"interrupt_response": interrupt, "silence_ms": 500})
        run = run_core([*answering(), _audio(0.1)], core)
        effects = core.completed(SpeechDetected([0.9]), _now())
        assert [w for w in said(effects) if not w.startswith("listen")] == expected, interrupt


# ------------------------------------------------------------------ refusals
@pytest.mark.parametrize(
    ("steps", "refused"),
    [
        ([frame(1)], True),  # nothing running, nothing asked
        ([frame(1), Warm(), *ask()], False),  # an answer runs
        ([frame(1), Read(AnswerRequest())], False),  # a request is read, not yet handled
    ],
)
def test_a_cancel_is_refused_only_when_nothing_runs_or_is_asked(steps: list[object], refused: bool) -> None:
    """Realtime's response.cancel with nothing to cancel gets response_cancel_not_active."""
    run = run_core(steps)
    effects = run.core.receive(Read(CancelRequest()), _now())
    errors = [e.event.code for e in effects if isinstance(e, Send) and isinstance(e.event, ev.ErrorReported)]
    assert errors == (["response_cancel_not_active"] if refused else [])


def test_an_exclusive_request_while_an_answer_runs_is_refused_but_waits_while_it_ends() -> None:
    """One response at a time: an exclusive request during a running answer is refused; one that
    comes while the answer is already stopping waits for its end and then starts."""
    request = AnswerRequest(exclusive=True)
    running = run_core([*answering(), Read(request)])
    effects = running.core.receive(Handle(request), _now())
    assert [e.event.code for e in effects if isinstance(e, Send)] == ["conversation_already_has_active_response"]

    stopping = run_core([*answering(), Read(client(type="response.cancel")), Read(request), Handle(request)])
    assert said(stopping.effects)[-2:] == ["stop answer:cancel", "stop answer:cancel"]
    assert not stopping.core.takes_lane_input  # it waits for the end
    ended = run_core([End()], stopping.core)
    assert said(ended.effects) == ["send AnswerEnded", "send AnswerStarted", "answer"]


# ------------------------------------------------------------------ waiting for the end
def test_a_question_during_an_answer_waits_for_its_end_with_what_comes_after_it() -> None:
    """A second question stops the first answer and is planned only after its end; a frame
    still goes on at once; video.done after it waits too, and ends the session after it."""
    run = run_core([*answering(), *ask("second?"), Handle(client(type="video.done"))])
    assert said(run.effects[-1:]) == ["stop answer:question"]
    assert not run.core.takes_lane_input
    more = run_core([frame(2, "f2")], run.core)
    assert "send FrameAcked" in said(more.effects)
    ended = run_core([End()], run.core)
    assert said(ended.effects) == ["send AnswerEnded", "send AnswerStarted", "answer"]
    last = run_core([Reply("two")], run.core)
    assert said(last.effects)[-3:] == ["send AnswerEnded", "send SessionDone", "end session"]


def test_video_done_lets_the_running_answer_finish() -> None:
    """video.done does not stop the answer: goodbye comes after its response.done."""
    run = run_core([*answering(), Read(client(type="video.done")), Handle(client(type="video.done"))])
    assert not any(w.startswith("stop") for w in said(run.effects))
    done = run_core([Reply()], run.core)
    assert said(done.effects)[-2:] == ["send SessionDone", "end session"]


# ------------------------------------------------------------------ the engine's jobs
def test_frames_warm_the_prefix_one_prefill_at_a_time() -> None:
    """An accepted frame starts a prefill; frames during it wait for its end, then one more
    prefill covers them."""
    run = run_core([frame(1, "f1"), frame(2, "f2"), frame(3, "f3")])
    assert said(run.effects).count("prefill") == 1
    again = run_core([Warm()], run.core)
    assert said(again.effects) == ["prefill"]
    assert said(run_core([Warm()], run.core).effects) == []


def test_a_question_during_a_prefill_stops_it_and_starts_when_it_has_ended() -> None:
    """The question stops the prefill; its answer starts once the stopped prefill is reported ended."""
    run = run_core([frame(1, "f1"), *ask()])
    assert said(run.effects)[-1] == "stop prefill"
    started = run_core([Warm()], run.core)
    assert said(started.effects) == ["send AnswerStarted", "answer"]


def test_an_item_edit_warms_the_prefix_again() -> None:
    """A conversation item that changes the timeline re-warms the prefix from there."""
    run = run_core([frame(1, "f1"), Warm()])
    edit = UserInput(item_id="u1", role="assistant", text="noted", previous_item_id=None)
    effects = run.core.receive(Handle(edit), _now())
    assert "prefill" in said(effects)


# ------------------------------------------------------------------ watches
@pytest.mark.parametrize(
    ("steps", "expected"),
    [
        # idle and red: the fire is sent, then its answer starts
        ([], ["send WatchFired", "send AnswerStarted", "answer"]),
        # a question came during the round: the round was preempted, nothing is decided, the question starts
        ([*ask()], ["send AnswerStarted", "answer"]),
    ],
)
def test_a_fire_starts_an_answer_only_when_nothing_else_is_asked(steps: list[object], expected: list[str]) -> None:
    """A round of checks on red fires and starts its answer when idle; a round a question
    stopped decides nothing (the frame is checked again after the answer) and the question goes first."""
    core = machine(watches=[RED])
    run = run_core([frame(1, "f1"), Warm()], core)
    assert said(run.effects)[-1] == "check"
    run = run_core([*steps, Checks({"red": 0.99})], core)
    tail = [w for w in said(run.effects) if w not in ("stop check",)]
    assert tail[-len(expected):] == expected


def test_only_the_first_of_two_fires_is_answered() -> None:
    """Two watches fire on one frame: both watch.fired are sent, one answer starts."""
    blue = {"watch_id": "blue", "condition": "Is there a cup?", "mode": "alert"}
    core = machine(watches=[RED, blue])
    run = run_core([frame(1, "f1"), Warm(), Checks({"red": 0.99, "blue": 0.99})], core)
    words = said(run.effects)
    assert words.count("answer") == 1 and words.count("send WatchFired") >= 1


@pytest.mark.parametrize("pace", [0.0, 0.5])
def test_a_paced_prefill_leaves_the_check_of_a_new_frame_room(pace: float) -> None:
    """Unpaced, a frame's prefill comes before its check. Paced (vLLM, engine=openai: a warm
    request at most every 0.5 s), a frame that comes sooner is checked at once (the check's
    request prefills it)."""
    run = run_core([frame(1, "f1"), Warm(), Checks({"red": 0.1}), frame(2, "f2")], machine(pace=pace, watches=[RED]))
    assert said(run.effects)[-1] == ("check" if pace else "prefill")


def test_a_check_while_a_paced_prefix_is_behind_looks_at_the_buffer_as_it_is() -> None:
    """Frames evicted while a paced prefix waits are not in the next round; its newest frame is."""
    core = machine(pace=0.5, watches=[RED], max_frames=2, enable_frame_filter=False)
    steps = [frame(1, "f1"), Warm(), Checks({"red": 0.1}), frame(2, "f2"), Checks({"red": 0.1}),
             Warm(),  # the next window's prefill (a slide starts at 2 of 2 frames)
             frame(3, "f3")]
    run = run_core(steps, core)
    assert said(run.effects)[-1] == "check"
    step = run.newest(Check).step  # type: ignore[attr-defined]
    assert not any(f.released for f in step.frames) and step.frame.frame_id == "f3"


def test_a_paced_prefill_waits_for_its_timer_and_nothing_else_waits() -> None:
    """A frame that comes within the warm interval of the last prefill gets a timer; a question
    meanwhile starts at once; the prefill starts when the timer is due."""
    core = machine(pace=0.5)
    run = run_core([frame(1, "f1"), Warm(), frame(2, "f2")], core)
    assert said(run.effects)[-1] == "timer" and said(run.effects).count("prefill") == 1
    assert said(run_core([*ask()], core).effects)[-1] == "answer"
    assert "prefill" not in said(run_core([Reply(), frame(3, "f3")], core).effects)  # the timer set stands
    assert said(run_core([At(100.6), Tick()], core).effects)[-1] == "prefill"


def test_no_checks_without_a_warm_prefix() -> None:
    """An engine that keeps no prefix runs no watch checks."""
    run = run_core([frame(1, "f1"), frame(2, "f2")], machine(warm=False, watches=[RED]))
    assert not any(isinstance(e, (Check, Prefill)) for e in run.effects)


# ------------------------------------------------------------------ the idle timeout
def test_silence_after_an_answer_starts_one_answer_once() -> None:
    """With idle_timeout_ms, the core asks for a tick idle_timeout_ms after an answer ends; an
    early tick does nothing; the due tick starts an answer over the conversation
    (the idle timeout event first); no silence counts after that answer."""
    core = machine(voice=HEARS, turn_detection={"idle_timeout_ms": 5000, "silence_ms": 500})
    run = run_core([frame(1, "f1"), Warm(), *ask(), Reply()], core)
    [timer] = [e for e in run.effects if isinstance(e, Timer)]
    ended_at = 100.0 + 0.01 * 6  # the Reply step's clock (six steps of 10 ms)
    assert timer.at == pytest.approx(ended_at + 5.0, abs=0.05)
    early = run_core([At(timer.at - 0.5), Tick()], core)
    assert early.effects == [Timer(timer.at)]  # the same time again, nothing started
    due = run_core([At(timer.at + 0.01), Tick()], core)
    assert said(due.effects) == ["send IdleTimeout", "send AnswerStarted", "answer"]
    after = run_core([Reply(), At(timer.at + 60), Tick()], core)
    assert "answer" not in said(after.effects) and not any(isinstance(e, Timer) and e.at for e in after.effects)


# ------------------------------------------------------------------ microphone
def test_turn_detection_switched_on_opens_a_fresh_voice_stream() -> None:
    """A session.update that switches turn detection reopens the voice activity stream."""
    core = machine(voice=HEARS)
    effects = core.receive(Handle(ConfigUpdate(changes={"turn_detection": {"silence_ms": 400}})), _now())
    assert ResetVad(True) in effects
    effects = core.receive(Handle(ConfigUpdate(changes={"turn_detection": None})), _now())
    assert ResetVad(False) in effects


def test_audio_a_question_will_take_is_transcribed_as_it_arrives() -> None:
    """Without turn detection, with a recogniser: buffered audio streams into a transcription
    (one start, then each chunk); a client that commits audio itself gets none."""
    streamed = run_core([_audio(0.1), _audio(0.1)], machine(voice=HEARS, turn_detection=None))
    words = said(streamed.effects)
    assert words == ["listen start", "listen feed", "listen feed"]
    feeds = [e for e in streamed.effects if isinstance(e, ListenFeed)]
    assert [len(f.pcm16) for f in feeds] == [3200, 3200] and feeds[-1].end == 3200
    committed = run_core([_audio(0.1)], machine(voice=HEARS, turn_detection=None, source=Source(commits_audio=True)))
    assert not any(isinstance(e, ListenStart) for e in committed.effects)


def test_a_spoken_question_is_answered_or_held_and_transcribed() -> None:
    """Speech that stops asks its question (create_response on); with create_response off it
    is held for the next answer and, as the engine cannot hear, transcribed now."""
    for create, expected in ((True, "answer"), (False, "transcribe held")):
        core = machine(voice=HEARS, turn_detection={"create_response": create, "silence_ms": 100,
                                                    "prefix_padding_ms": 0})
        run_core([frame(1, "f1"), Warm(), _audio(0.1)], core)
        effects = core.completed(SpeechDetected([0.9] * 3 + [0.0] * 6), _now())
        assert expected in said(effects), (create, said(effects))
        if not create:
            assert any(isinstance(e, TranscribeHeld) for e in effects)


# ------------------------------------------------------------------ answers' audio
def test_the_engines_own_voice_is_trimmed_once_at_the_start() -> None:
    """An engine that speaks: its first chunk loses native_trim_ms, the rest pass whole."""
    voice = VoicePaths(output="native")
    core = machine(voice=voice, source=Source(native_trim_ms=20), modalities=["text", "audio"])
    wav = _wav(0.1)
    run = run_core([frame(1, "f1"), Warm(), *ask(), Reply("hi", audio=(wav, wav))], core)
    deltas = [e.event for e in run.effects if isinstance(e, Send) and isinstance(e.event, ev.AnswerAudioDelta)]
    sizes = [len(d.data) for d in deltas]
    assert len(sizes) == 2 and sizes[0] < sizes[1]


def test_a_frame_shed_is_acked_overloaded() -> None:
    """A frame the server could not take gets its overloaded ack from the core."""
    core = machine()
    event = VideoFrame(type="video.frame", data=b64(b"x"), frame_id="f9")
    effects = core.receive(FrameShed(event), _now())
    acks = [e.event for e in effects if isinstance(e, Send)]
    assert isinstance(acks[0], ev.FrameAcked) and acks[0].reason == "overloaded"


def test_after_an_answer_the_next_frame_warms_from_it() -> None:
    """An ended answer is in the engine's cache already: no prefill until a frame comes."""
    run = run_core([frame(1, "f1"), Warm(), *ask(), Reply()])
    assert said(run.effects)[-1] == "send AnswerEnded" and run.core.answering is False
    assert said(run_core([frame(2, "f2")], run.core).effects)[-1] == "prefill"


def _now() -> Now:
    return Now(1000.0, 1_000_000.0)


def _audio(seconds: float) -> Handle:
    pcm = (np.sin(np.arange(int(16000 * seconds)) / 5) * 8000).astype("<i2").tobytes()
    return Handle(client(type="audio.chunk", data=b64(pcm)))


def _wav(seconds: float) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1), w.setsampwidth(2), w.setframerate(24000)
        w.writeframes(np.zeros(int(24000 * seconds), "<i2").tobytes())
    return out.getvalue()



def test_a_session_that_never_catches_up_with_its_frames_still_checks_its_watches() -> None:
    """Frames keep coming while each prefill runs (more cameras than the model keeps up with):
    once two frames in a row went unchecked, the round goes before the next prefill (it warms
    the new frames itself) and looks at the newest frame; a session that keeps up prefills first."""
    core = machine(watches=[RED], enable_frame_filter=False)
    run = run_core([frame(1, "f1"), frame(2, "f2"), Warm(), frame(3, "f3"), Warm()], core)
    assert said(run.effects)[-1] == "check"
    assert run.newest(Check).step.frame.frame_id == "f3"  # type: ignore[attr-defined]
    steady = machine(watches=[RED], enable_frame_filter=False)
    run = run_core([frame(1, "f1"), Warm(), Checks({"red": 0.1}), frame(2, "f2")], steady)
    assert said(run.effects)[-1] == "prefill"
