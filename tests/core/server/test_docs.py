"""The user docs stay true to the code, both ways: what the code has is documented, and what
the docs name exists (nothing here starts a server or imports torch)."""

from __future__ import annotations

import argparse
import re
import typing
from pathlib import Path

import pytest
from pydantic import BaseModel

from handlers.core.negotiation import Limits
from handlers.core.session_core import SessionCore
from handlers.wire.errors import CLOSE_CODES, ErrorCode
from handlers.wire.protocol import CLIENT_TYPES, SERVER_TYPES, AnyServerEvent, ClientEvent, SessionConfig
from server.engines.base import Capabilities
from server.settings import Settings

ROOT = Path(__file__).resolve().parents[3]
USER_DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
#: Flags the docs quote that are not the ``livesight`` command's: a placeholder (``--setting``)
#: and other programs' (docker compose, vLLM and its router, py-spy).
OTHER_PROGRAMS_FLAGS = frozenset(
    {"--setting", "--build", "--profile", "--limit-mm-per-prompt", "--mm-processor-cache-gb",
     "--api-server-count", "--routing-logic", "--session-key", "--threads", "--nonblocking"}
)


def _doc(name: str) -> str:
    return (ROOT / "docs" / name).read_text()


def _all_docs() -> str:
    return "\n".join(path.read_text() for path in USER_DOCS)


def _section(text: str, heading: str) -> str | None:
    """The section whose heading holds ``heading``, to the next heading of any level (None: no such heading)."""
    found = re.search(rf"^#+ .*{re.escape(heading)}.*$", text, flags=re.M)
    if found is None:
        return None
    end = re.search(r"^#", text[found.end() :], flags=re.M)
    return text[found.start() : found.end() + end.start()] if end else text[found.start() :]


def _place(text: str, name: str) -> str:
    """Where a doc describes ``name``: its section, or else its table row (``| `name` | ...``)."""
    section = _section(text, f"`{name}`")
    if section is not None:
        return section
    row = re.search(rf"^\| `{re.escape(name)}` \|.*$", text, flags=re.M)
    assert row is not None, f"{name} has neither a section nor a table row"
    return row.group()


def _models_in(annotation: object) -> list[type[BaseModel]]:
    """The pydantic models a field's type holds (``X | None``, ``list[X]`` ...)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [model for arg in typing.get_args(annotation) for model in _models_in(arg)]


def _unnamed_fields(model: type[BaseModel], place: str, events: list[type[BaseModel]]) -> list[str]:
    """The wire fields of ``model`` and of the models inside it that ``place`` does not name as
    `field`: not ``type`` of an event, not excluded from the wire, not models described as events."""
    names = [n for n, f in model.model_fields.items() if not f.exclude and not (n == "type" and model in events)]
    missing = [f"{model.__name__}.{n}" for n in [*names, *model.model_computed_fields] if f"`{n}`" not in place]
    for name in names:
        for inner in _models_in(model.model_fields[name].annotation):
            if not any(issubclass(event, inner) for event in events):
                missing += _unnamed_fields(inner, place, events)
    return missing


def _events(union: object) -> list[type[BaseModel]]:
    """The event models of a discriminated union (``ClientEvent``, ``AnyServerEvent``)."""
    return list(typing.get_args(typing.get_args(union)[0]))


def _kind(event: type[BaseModel]) -> str:
    """An event model's ``type`` on the wire."""
    return typing.get_args(event.model_fields["type"].annotation)[0]


def _livesight_parser() -> argparse.ArgumentParser:
    """The ``livesight`` parser as server/cli.py's ``main`` builds it, taken before it parses."""
    from server import cli

    class Built(Exception):
        pass

    def stop(parser: argparse.ArgumentParser, *args: object, **kwargs: object) -> None:
        raise Built(parser)

    with pytest.MonkeyPatch.context() as patch, pytest.raises(Built) as built:
        patch.setattr(argparse.ArgumentParser, "parse_args", stop)
        cli.main([])
    return built.value.args[0]


def _commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    subparsers = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(subparsers[0].choices) if subparsers else {}


def _flags(parser: argparse.ArgumentParser) -> set[str]:
    """Every ``--flag`` of ``parser`` and of its commands, at any depth."""
    own = {flag for action in parser._actions for flag in action.option_strings if flag.startswith("--")}
    return own.union(*(_flags(command) for command in _commands(parser).values()))


def test_configuration_doc_lists_every_setting() -> None:
    """Every settings field appears in docs/configuration.md with its flag and variable."""
    text = _doc("configuration.md")
    for name in Settings.model_fields:
        assert f"`--{name.replace('_', '-')}`" in text, name
        assert f"`LIVESIGHT_{name.upper()}`" in text, name


def test_protocol_doc_lists_every_type_and_code() -> None:
    """Every client message type, server event type and error code is documented in docs/protocol.md."""
    text = _doc("protocol.md")
    for kind in CLIENT_TYPES | SERVER_TYPES:
        assert f"`{kind}`" in text, kind
    for code in ErrorCode:
        assert f"`{code.value}`" in text, code


def test_protocol_doc_contents_list_every_section() -> None:
    """docs/protocol.md's contents link every one of its ``##`` sections."""
    text = _doc("protocol.md")
    contents = text.split("\n## ")[0]
    anchors = [re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in re.findall(r"^## (.+)$", text, flags=re.M)]
    assert [a for a in anchors if f"](#{a})" not in contents] == []


def test_protocol_doc_names_every_event_field() -> None:
    """Every field of every v1 event, both ways, and of the models inside them, is named where
    docs/protocol.md describes that event."""
    text = _doc("protocol.md")
    events = _events(ClientEvent) + _events(AnyServerEvent)
    missing = [f"{_kind(e)}: {name}" for e in events for name in _unnamed_fields(e, _place(text, _kind(e)), events)]
    assert missing == []


def test_protocol_doc_names_every_limit_and_capability() -> None:
    """Every key of session.ready's limits and capabilities, as the core builds them, is in its section."""
    limits = Limits(max_frame_bytes=1024, max_audio_bytes=1024, max_queue=1, idle_timeout_s=1.0,
                    max_history_turns=1, max_answer_tokens=1)
    ready = SessionCore("0" * 32, limits, Capabilities(name="engine", model="model")).configure(SessionConfig())
    place = _place(_doc("protocol.md"), "session.ready")
    assert [key for key in [*ready.limits, *ready.capabilities] if f"`{key}`" not in place] == []


def test_protocol_doc_error_table_is_the_codes_and_their_closes() -> None:
    """docs/protocol.md's table of error codes holds only ErrorCodes, each with the close code it really gets."""
    table = _section(_doc("protocol.md"), "Error codes") or ""
    rows = re.findall(r"^\| `([a-z_]+)` \|.*\| (yes|no) \| ?(\d*) ?\|$", table, flags=re.M)
    documented = {code: int(close) if closes == "yes" else None for code, closes, close in rows}
    assert documented == {code.value: CLOSE_CODES.get(code) for code in ErrorCode if code.value in documented}
    assert set(documented) == {code.value for code in ErrorCode}


def test_docs_name_every_command() -> None:
    """Every ``livesight`` command and ``livesight bench`` benchmark is named in README.md or docs/."""
    text = _all_docs()
    commands = _commands(_livesight_parser())
    named = [f"livesight {c}" for c in commands] + [f"livesight bench {b}" for b in _commands(commands["bench"])]
    assert [n for n in named if not re.search(rf"{re.escape(n)}(?![\w-])", text)] == []


def test_docs_name_only_real_flags_and_variables() -> None:
    """Every ``LIVESIGHT_*`` variable in README.md and docs/ is a setting, and every ``--flag`` is
    one of the ``livesight`` command's (or a quoted flag of another program)."""
    text = _all_docs()
    variables = set(re.findall(r"LIVESIGHT_([A-Z0-9_]*[A-Z0-9])", text))
    assert {v for v in variables if v.lower() not in Settings.model_fields} == set()
    flags = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", text))
    assert flags - _flags(_livesight_parser()) - OTHER_PROGRAMS_FLAGS == set()


def test_architecture_doc_lays_out_every_module() -> None:
    """docs/architecture.md's source layout names every module of server/ and handlers/ under its package."""
    layout = _doc("architecture.md").split("## Source layout")[1]
    named, package = set(), ""
    for line in layout.splitlines():
        package = line.split()[0] if re.match(r"^[a-z_/]+/(\s|$)", line) else package
        named |= {package + name for name in re.findall(r"\b\w+\.py\b", line)}
    modules = {str(p.relative_to(ROOT)) for top in ("server", "handlers") for p in (ROOT / top).rglob("*.py")}
    assert {m for m in modules if not m.endswith("__init__.py")} - named == set()


def test_readme_starts_with_the_two_commands() -> None:
    """The README opens with the serve and test commands."""
    head = (ROOT / "README.md").read_text().split("\n\n")[1]
    assert "make serve" in head and "make test" in head


def test_realtime_doc_lists_every_event() -> None:
    """Every Realtime client and server event type is documented in docs/realtime.md."""
    from handlers.realtime.events import REALTIME_CLIENT_TYPES, REALTIME_SERVER_TYPES

    text = _doc("realtime.md")
    for kind in REALTIME_CLIENT_TYPES | REALTIME_SERVER_TYPES:
        assert f"`{kind}`" in text, kind


def test_session_doc_shows_the_transition_table() -> None:
    """docs/session.md's table of turn states holds exactly the lifecycle's transitions."""
    from handlers.core.lifecycle import TRANSITIONS

    text = _doc("session.md")
    rows = re.findall(r"^\| `(\w+)` \| `(\w+)` \| `(\w+)` \|", text, flags=re.M)
    assert {(s, t): n for s, t, n in rows} == {(s.value, t.value): n.value for (s, t), n in TRANSITIONS.items()}
    assert len(rows) == len(TRANSITIONS)
