"""The ``livesight`` command: ``serve``, ``make-tiny-model``, ``stream`` and ``bench`` (``ttft``,
``intake``, ``load``, ``storm``, ``voice``, ``engine``, ``router``, ``fuzz``, ``watch``, ``demo``, ``live``,
``memory``)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import Any

from server.settings import Settings


def _add_setting_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per settings field; the environment (LIVESIGHT_*) fills what is not given."""
    for name, field in Settings.model_fields.items():
        flag = "--" + name.replace("_", "-")
        help_text = f"{field.description} (env LIVESIGHT_{name.upper()})".replace("%", "%%")  # argparse formats help
        if field.annotation is bool:
            parser.add_argument(flag, dest=name, action=argparse.BooleanOptionalAction, default=None, help=help_text)
        else:
            parser.add_argument(flag, dest=name, default=None, help=help_text)


def _settings(args: argparse.Namespace) -> Settings:
    given: dict[str, Any] = {k: v for k, v in vars(args).items() if k in Settings.model_fields and v is not None}
    return Settings(**given)


def serve(settings: Settings) -> None:
    """Run the server until interrupted."""
    import uvicorn

    from server.app import create_app
    from server.listener import uvicorn_config
    from server.drain import DrainingServer
    from server.logs import configure_logging

    configure_logging(settings.log_level, settings.log_format)
    app = create_app(settings)
    config = uvicorn_config(app, settings, log_config=None)  # uvicorn's loggers go to configure_logging's handler
    DrainingServer(config, app.state.drain).run()  # SIGTERM: drain the sessions, then stop


def _add_stream_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", type=Path, help="a video file (decoded with PyAV) or a folder of images")
    parser.add_argument(
        "--url", default="ws://127.0.0.1:8000/v1/video/chat/stream", help="the server's WebSocket URL"
    )
    parser.add_argument(
        "--ask", action="append", default=[], metavar="[SECONDS:]TEXT",
        help='a question (repeatable); "3.5:TEXT" asks at 3.5 s of video time, plain TEXT after the last frame',
    )
    parser.add_argument("--fps", type=float, default=2.0, help="frames sent per second of video (0: every frame)")
    parser.add_argument("--speed", type=float, default=1.0, help="play the source this many times faster (0: no waiting)")
    parser.add_argument("--quality", type=int, default=80, help="JPEG quality, 1-95")
    parser.add_argument("--max-side", type=int, default=640, help="scale frames down to this longest side (0: as is)")
    parser.add_argument("--api-key", default=None, help="sent as ?api_key= when given")
    parser.add_argument("--max-frames", type=int, default=None, help="frames the server keeps (session.config)")
    parser.add_argument("--max-tokens", type=int, default=None, help="longest answer in tokens")
    parser.add_argument("--temperature", type=float, default=None, help="sampling temperature (0: greedy)")
    parser.add_argument("--system-prompt", default=None)
    parser.add_argument(
        "--frame-filter", action=argparse.BooleanOptionalAction, default=None, help="drop near-duplicate frames"
    )


def stream(args: argparse.Namespace) -> int:
    """Run ``livesight stream``; returns the exit status (1 when the session failed)."""
    import asyncio

    from websockets.exceptions import WebSocketException

    from server.client.connection import StreamError
    from server.client.runner import Question, run_stream

    sampling = {k: v for k, v in (("max_tokens", args.max_tokens), ("temperature", args.temperature)) if v is not None}
    config = {
        k: v
        for k, v in (
            ("max_frames", args.max_frames),
            ("system_prompt", args.system_prompt),
            ("enable_frame_filter", args.frame_filter),
            ("sampling", sampling or None),
        )
        if v is not None
    }
    try:
        report = asyncio.run(
            run_stream(
                args.source, args.url, [Question.parse(q) for q in args.ask], config=config, fps=args.fps,
                speed=args.speed, quality=args.quality, max_side=args.max_side, api_key=args.api_key,
            )
        )
    except (StreamError, OSError, ValueError, WebSocketException) as exc:
        print(f"livesight stream: {exc}", file=sys.stderr)
        return 1
    return 0 if all(a.status in {"completed", "interrupted"} for a in report.answers) else 1


def retrace(model_dir: Path) -> int:
    """Run ``make-tiny-model DIR --task colours --retrace``: train the recipe of the colours model
    in ``model_dir`` (its family and seed) as far as its card's fingerprints, in a temporary
    directory, and compare; returns the exit status (1 when they differ or the card has none)."""
    import tempfile

    from server.models.colours import read_colours_card, retrace_colours_model

    try:
        card = read_colours_card(model_dir)
    except (OSError, ValueError) as exc:
        print(f"livesight make-tiny-model: cannot read the colours model in {model_dir}: {exc}", file=sys.stderr)
        return 1
    if card is None or not card.current or not card.fingerprints:
        print(f"livesight make-tiny-model: {model_dir} holds no current colours model with fingerprints "
              "(write it with this version's make-tiny-model --task colours)", file=sys.stderr)
        return 1
    expected = card.fingerprints
    with tempfile.TemporaryDirectory(prefix="livesight-retrace-") as scratch:
        found = retrace_colours_model(Path(scratch), family=card.family, seed=card.seed)
    differ = sorted(name for name in expected if found.get(name) != expected[name])
    if differ:
        print(f"the recipe does not make the colours model in {model_dir}: its weights differ at {', '.join(differ)}",
              file=sys.stderr)
        return 1
    print(f"the recipe makes the colours model in {model_dir}: its weights match at {', '.join(sorted(expected))}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="livesight", description="live video understanding server")
    sub = parser.add_subparsers(dest="command", required=True)

    p_serve = sub.add_parser("serve", help="start the server")
    _add_setting_flags(p_serve)

    p_tiny = sub.add_parser(
        "make-tiny-model", help="write a tiny image-text model: random weights, or trained here to see colours"
    )
    p_tiny.add_argument("dir", type=Path)
    p_tiny.add_argument("--family", choices=["qwen2_5_vl", "idefics3"], default="qwen2_5_vl")
    p_tiny.add_argument(
        "--task", choices=["random", "colours"], default="random",
        help="random: random weights, answers are noise (seconds); colours: trained on this machine (about 3 min) "
        "to answer 'Is the screen red?' with yes/no and 'What colour is the screen?' with red, green, blue, "
        "yellow, white, black or grey, about the newest frame (accuracy and answer token ids in the model's "
        "livesight_demo.json)",
    )
    p_tiny.add_argument(
        "--init-std", type=float, default=None, help="weight init std (0.3 makes a sharp model; --task random only)"
    )
    p_tiny.add_argument("--seed", type=int, default=0, help="the same seed writes the same model")
    p_tiny.add_argument(
        "--retrace", action="store_true",
        help="--task colours: DIR holds a colours model (the shipped ones are in server/models/weights); train its "
        "recipe again as far as the fingerprints its card records (about a third of the training) and compare: "
        "exit status 1 when they differ",
    )

    p_bench = sub.add_parser("bench", help="benchmarks that print numbers and ratios")
    bench_sub = p_bench.add_subparsers(dest="bench", required=True)
    p_ttft = bench_sub.add_parser("ttft", help="time to first output, warm prefix on vs off")
    p_ttft.add_argument("--model", default=None, help="model path or id (default: the tiny random-weight model)")
    p_ttft.add_argument("--frames", default="1,8,32,64", help="comma-separated frame counts")
    p_ttft.add_argument("--queries", type=int, default=3, help="queries per measurement (median is shown)")
    p_ttft.add_argument(
        "--conversation", action="store_true", help="a conversation: first question, follow-ups, new frames between"
    )

    p_intake = bench_sub.add_parser("intake", help="server CPU per accepted 640x480 frame")
    p_intake.add_argument("--model", default=None)
    p_intake.add_argument("--frames", type=int, default=200)

    p_load = bench_sub.add_parser("load", help="many sessions streaming real footage: ack latency, lost acks, CPU, RSS")
    p_load.add_argument("--model", default=None)
    p_load.add_argument("--sessions", type=int, default=100)
    p_load.add_argument("--fps", type=float, default=2.0)
    p_load.add_argument("--seconds", type=float, default=20.0, help="how long each session streams")
    p_load.add_argument("--ask-every", type=float, default=30.0, help="seconds between a session's questions (0: none)")
    p_load.add_argument("--serve-args", default="", help='more flags for the server, e.g. "--intake-max-wait-ms 30"')
    p_load.add_argument("--clients", type=int, default=2, help="load generator processes the sessions are split over")
    p_load.add_argument(
        "--continuous", action="store_true",
        help="each session asks its next question the moment the previous answer's response.done arrives "
        "(--ask-every is not used; no probe); prints the answers' rate and TTFT and the sessions' own acks",
    )
    p_load.add_argument("--max-tokens", type=int, default=8,
                        help="longest answer in tokens (1: answers end at once, the hard case with --continuous)")
    p_load.add_argument(
        "--prefix-warmup", action=argparse.BooleanOptionalAction, default=None,
        help="the sessions' prefix_warmup (default: off, on with --continuous, as an asking client keeps it)",
    )
    p_load.add_argument(
        "--busy", type=int, default=0, metavar="N",
        help="N more processes spin on the CPU for the whole run (a host whose cores other work keeps busy)",
    )
    p_load.add_argument(
        "--flood", choices=["ping", "query", "cancel"], default=None,
        help="one more session sends this message back to back, reading the replies, in the second half of the "
        "run (no probe); prints the other sessions' acks without and with the flood and what the flooder got back",
    )

    p_storm = bench_sub.add_parser("storm", help="a session streaming while a hundred others connect and leave at once")
    p_storm.add_argument("--model", default=None)
    p_storm.add_argument("--sessions", type=int, default=100)
    p_storm.add_argument("--rounds", type=int, default=3)

    p_voice = bench_sub.add_parser("voice", help="sentence-to-speech latency, speech real-time factor, VAD, barge-in")
    p_voice.add_argument("--model", default=None, help="model path or id (default: the tiny random-weight model)")
    p_voice.add_argument("--answers", type=int, default=5, help="spoken answers timed")
    p_voice.add_argument("--max-tokens", type=int, default=200, help="length of each timed answer")

    p_engine = bench_sub.add_parser("engine", help="what one streaming session costs a remote vLLM server")
    p_engine.add_argument("--frames", default="8,32,64", help="comma-separated window sizes")
    p_engine.add_argument("--fps", type=float, default=2.0, help="frames streamed per second")
    p_engine.add_argument("--modes", default="before,after", help="before (every image's data), after (uuid refs)")
    p_engine.add_argument("--max-warmups-per-s", type=float, default=2.0)
    p_router = bench_sub.add_parser("router", help="a vLLM pool behind HAProxy against the built-in pinning")
    p_router.add_argument("--sessions", type=int, default=8)
    p_router.add_argument("--frames", type=int, default=8, help="frames each session streams before its question")
    p_fuzz = bench_sub.add_parser("fuzz", help="hostile messages through the real server, each answer checked")
    p_fuzz.add_argument("--model", default=None, help="model path or id (default: the tiny random-weight model)")
    p_fuzz.add_argument("--messages", type=int, default=10_000, help="hostile messages sent")
    p_fuzz.add_argument("--seed", type=int, default=None, help="hypothesis seed (default: a fixed sequence)")

    p_watch = bench_sub.add_parser("watch", help="watches on the colours model: check cost, decision latency, hits")
    p_watch.add_argument("--model", default=None, help="a colours model (default: one trained first, minutes)")
    p_watch.add_argument("--sessions", type=int, default=4)
    p_watch.add_argument("--watches", type=int, default=2, help="watches per session (red, blue, green, ...)")
    p_watch.add_argument("--seconds", type=float, default=20.0, help="how long each phase streams")
    p_watch.add_argument("--rounds", type=int, default=2, help="phases without and with watches, alternating")

    p_demo = bench_sub.add_parser("demo", help="the demo model at the server's defaults: colours named, watch fires")
    p_demo.add_argument("--model", default=None, help="a colours model (default: the demo model)")
    p_demo.add_argument("--minutes", type=float, default=3.0, help="how long the session streams (stream time)")
    p_demo.add_argument("--fps", type=float, default=2.0, help="camera frames per second of stream time")
    p_demo.add_argument("--scene-s", type=float, default=10.0, help="seconds between the screen's colour changes")
    p_demo.add_argument("--ask-every-s", type=float, default=3.0, help="seconds between questions")
    p_demo.add_argument("--speed", type=float, default=1.0, help="send frames this much faster than real time")

    p_live = bench_sub.add_parser("live", help="one Gemini Live SDK session for minutes: time to first output, RSS")
    p_live.add_argument("--model", default=None, help="model path or id (default: the tiny random-weight model)")
    p_live.add_argument("--minutes", type=float, default=20.0, help="how long the session streams")
    p_live.add_argument("--fps", type=float, default=1.0, help="camera frames sent per second")
    p_live.add_argument("--ask-every-s", type=float, default=60.0, help="seconds between typed questions")
    p_live.add_argument("--max-tokens", type=int, default=16, help="tokens per answer")

    p_long = bench_sub.add_parser("long", help="one camera session for minutes through many window slides, on one "
                                  "engine: time to first output, cached shares, prefill work, watch fires, RSS")
    p_long.add_argument("--engine", choices=("transformers", "vllm", "openai"), default="transformers",
                        help="the engine (vllm: in the server's process; openai: in front of vLLM's own server)")
    p_long.add_argument("--model", default=None, help="model path, or 'colours' for the shipped colours model "
                        "(default: the random model of real size; on vLLM a random Idefics3)")
    p_long.add_argument("--minutes", type=float, default=30.0, help="how long the session streams")
    p_long.add_argument("--fps", type=float, default=2.0, help="camera frames sent per second")
    p_long.add_argument("--ask-every-s", type=float, default=30.0, help="seconds between questions")
    p_long.add_argument("--max-frames", type=int, default=None, help="the session's buffer (default: the server's)")

    p_shift = bench_sub.add_parser("shift", help="the embedded engine's moved prefix against cold prefills of the "
                                   "same windows: answers agreeing, check probability gaps")
    p_shift.add_argument("--model", default="colours",
                         help="'colours' (the demo model), 'random' (the random-weight model of real size) or a path")
    p_shift.add_argument("--frames", type=int, default=400, help="frames streamed")
    p_shift.add_argument("--window", type=int, default=50, help="frames in the window")
    p_shift.add_argument("--ask-every", type=int, default=3, help="frames between questions once the window is full")
    p_shift.add_argument("--scene", type=int, default=20, help="frames per colour scene")

    p_memory = bench_sub.add_parser("memory", help="a session's memory over a compressed stream-hour on the colours "
                                    "model: bytes stored, CPU per frame, text and condition search, range questions")
    p_memory.add_argument("--minutes", type=float, default=60.0, help="stream time (a 2 fps camera)")
    p_memory.add_argument("--memory-url", default=None,
                          help="postgresql://... (default: SQLite in a temporary data dir)")
    p_memory.add_argument("--speed", type=float, default=50.0,
                          help="frames paced this many times faster than real time (keyframe settings divided by it)")

    p_webrtc = bench_sub.add_parser("webrtc", help="WebRTC calls with 30 fps camera tracks against the same sessions "
                                    "over the WebSocket: server CPU per session, frame age, time to first audio")
    p_webrtc.add_argument("--sessions", type=int, default=20, help="calls (then WebSocket sessions)")
    p_webrtc.add_argument("--seconds", type=float, default=30.0, help="how long each transport streams")

    p_cameras = bench_sub.add_parser("cameras", help="RTSP cameras pulled by the server, each with an alert watch "
                                     "delivered to a webhook: CPU per stream, decision latency, fires, memory")
    p_cameras.add_argument("--streams", type=int, default=20, help="RTSP cameras (25 fps, sampled at 2)")
    p_cameras.add_argument("--seconds", type=float, default=60.0, help="how long the cameras are watched")
    p_cameras.add_argument("--size", default="640x480", help="the cameras' picture, WIDTHxHEIGHT")
    p_cameras.add_argument("--max-frames", type=int, default=None, help="each stream's window (session max_frames)")

    p_stream = sub.add_parser("stream", help="stream a video file or image folder to a server and ask questions")
    _add_stream_flags(p_stream)

    args = parser.parse_args(argv)
    if args.command == "stream":
        return stream(args)
    if args.command == "serve":
        serve(_settings(args))
    elif args.command == "make-tiny-model" and args.task == "colours":
        from server.models.colours import make_colours_model

        if args.init_std is not None:
            parser.error("--init-std is for --task random")
        from server.models.colours import portable_numerics_missing

        env = portable_numerics_missing()
        if env:  # the kernels are chosen when torch first computes: start again with them fixed
            argv = sys.argv[1:] if argv is None else argv
            os.execve(sys.executable, [sys.executable, "-m", "server.cli", *argv], env)
        if args.retrace:
            return retrace(args.dir)
        path = make_colours_model(args.dir, family=args.family, seed=args.seed)
        print(f"wrote a {args.family} colours model to {path}")
    elif args.command == "make-tiny-model" and args.retrace:
        parser.error("--retrace is for --task colours")
    elif args.command == "make-tiny-model":
        from server.models.tiny import make_tiny_model

        path = make_tiny_model(args.dir, family=args.family, init_std=args.init_std, seed=args.seed)
        print(f"wrote a random-weight {args.family} model to {path}")
    elif args.command == "bench":
        logging.basicConfig(level="WARNING")
        if args.bench == "ttft" and args.conversation:
            from server.bench.conversation import run_conversation

            print(run_conversation(args.model, [int(n) for n in args.frames.split(",")], args.queries))
        elif args.bench == "ttft":
            from server.bench.ttft import run_ttft

            counts = [int(n) for n in args.frames.split(",")]
            print(run_ttft(args.model, counts, args.queries))
        elif args.bench == "engine":
            from server.bench.engine import run_engine

            counts = [int(n) for n in args.frames.split(",")]
            print(run_engine(counts, args.fps, args.modes.split(","), args.max_warmups_per_s))
        elif args.bench == "router":
            from server.bench.router import run_router

            print(run_router(args.sessions, args.frames))
        elif args.bench == "fuzz":
            from server.bench.fuzz import run_fuzz

            print(run_fuzz(args.model, args.messages, args.seed))
        elif args.bench == "load":
            from server.bench.load import Scenario, run_load

            warm = args.continuous if args.prefix_warmup is None else args.prefix_warmup
            scenario = Scenario(args.fps, args.seconds, args.ask_every, args.continuous, args.max_tokens, warm)
            print(run_load(args.model, args.sessions, scenario, args.serve_args.split(), clients=args.clients,
                           busy=args.busy, flood=args.flood))
        elif args.bench == "storm":
            from server.bench.storm import run_storm

            print(run_storm(args.model, args.sessions, args.rounds))
        elif args.bench == "watch":
            from server.bench.watch import run_watch

            print(run_watch(args.model, args.sessions, args.watches, args.seconds, args.rounds))
        elif args.bench == "demo":
            from server.bench.demo import run_demo

            print(run_demo(args.model, args.minutes, args.fps, args.scene_s, args.ask_every_s, args.speed))
        elif args.bench == "live":
            from server.bench.live import run_live

            run_live(args.model, args.minutes, args.fps, args.ask_every_s, args.max_tokens)
        elif args.bench == "long":
            import tempfile

            from server.bench.long import run_long

            with tempfile.TemporaryDirectory() as folder:
                run_long(args.engine, args.model, args.minutes, args.fps, args.ask_every_s, args.max_frames, Path(folder))
        elif args.bench == "cameras":
            from server.bench.cameras import bench_cameras

            width, _, height = args.size.partition("x")
            bench_cameras(args.streams, args.seconds, (int(width), int(height)), args.max_frames)
        elif args.bench == "webrtc":
            from server.bench.webrtc import bench_webrtc

            bench_webrtc(args.sessions, args.seconds)
        elif args.bench == "memory":
            from server.bench.memory import bench_memory

            bench_memory(args.minutes, args.memory_url, args.speed)
        elif args.bench == "shift":
            from server.bench.shift import run_shift

            run_shift(args.model, args.frames, args.window, args.ask_every, args.scene)
        elif args.bench == "voice":
            from server.bench.voice import run_voice

            print(run_voice(args.model, args.answers, args.max_tokens))
        else:
            from server.bench.intake import run_intake

            print(run_intake(args.model, args.frames))
    return 0


if __name__ == "__main__":
    sys.exit(main())
