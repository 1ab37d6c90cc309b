"""The ``livesight`` command: ``serve``, ``make-tiny-model``."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

from server.settings import Settings


def _add_setting_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per settings field; the environment (LIVESIGHT_*) fills what is not given."""
    for name, field in Settings.model_fields.items():
        flag = "--" + name.replace("_", "-")
        help_text = f"{field.description} (env LIVESIGHT_{name.upper()})"
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

    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    app = create_app(settings)
    uvicorn.run(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level.lower(),
        ws_max_size=settings.max_message_bytes,
        ws_ping_interval=20,
        ws_ping_timeout=60,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="livesight", description="live video understanding server")
    sub = parser.add_subparsers(dest="command", required=True)

    p_serve = sub.add_parser("serve", help="start the server")
    _add_setting_flags(p_serve)

    p_tiny = sub.add_parser("make-tiny-model", help="write a tiny random-weight image-text model")
    p_tiny.add_argument("dir", type=Path)
    p_tiny.add_argument("--family", choices=["qwen2_5_vl", "idefics3"], default="qwen2_5_vl")
    p_tiny.add_argument("--init-std", type=float, default=None, help="weight init std (0.3 makes a sharp model)")
    p_tiny.add_argument("--seed", type=int, default=0)

    p_bench = sub.add_parser("bench", help="benchmarks that print numbers and ratios")
    bench_sub = p_bench.add_subparsers(dest="bench", required=True)
    p_ttft = bench_sub.add_parser("ttft", help="time to first output, warm prefix on vs off")
    p_ttft.add_argument("--model", default=None, help="model path or id (default: the tiny demo model)")
    p_ttft.add_argument("--frames", default="1,8,32,64", help="comma-separated frame counts")
    p_ttft.add_argument("--queries", type=int, default=3, help="queries per measurement (median is shown)")

    p_intake = bench_sub.add_parser("intake", help="server CPU per accepted 640x480 frame")
    p_intake.add_argument("--model", default=None)
    p_intake.add_argument("--frames", type=int, default=200)

    args = parser.parse_args(argv)
    if args.command == "serve":
        serve(_settings(args))
    elif args.command == "make-tiny-model":
        from server.tiny_model import make_tiny_model

        path = make_tiny_model(args.dir, family=args.family, init_std=args.init_std, seed=args.seed)
        print(f"wrote a random-weight {args.family} model to {path}")
    elif args.command == "bench":
        from server.bench import run_ttft

        logging.basicConfig(level="WARNING")
        if args.bench == "ttft":
            counts = [int(n) for n in args.frames.split(",")]
            print(run_ttft(args.model, counts, args.queries))
        else:
            from server.bench import run_intake

            print(run_intake(args.model, args.frames))
    return 0


if __name__ == "__main__":
    sys.exit(main())
