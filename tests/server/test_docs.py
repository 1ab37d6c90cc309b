"""The user docs stay true to the code."""

from __future__ import annotations

from pathlib import Path

from handlers.wire.errors import ErrorCode
from handlers.wire.protocol import CLIENT_TYPES
from server.settings import Settings

ROOT = Path(__file__).resolve().parents[2]


def test_configuration_doc_lists_every_setting() -> None:
    """Every settings field appears in docs/configuration.md with its flag and variable."""
    text = (ROOT / "docs" / "configuration.md").read_text()
    for name in Settings.model_fields:
        assert f"`--{name.replace('_', '-')}`" in text, name
        assert f"`LIVESIGHT_{name.upper()}`" in text, name


def test_protocol_doc_lists_every_type_and_code() -> None:
    """Every client message type and error code is documented in docs/protocol.md."""
    text = (ROOT / "docs" / "protocol.md").read_text()
    for kind in CLIENT_TYPES:
        assert f"`{kind}`" in text, kind
    for code in ErrorCode:
        assert f"`{code.value}`" in text, code


def test_readme_starts_with_the_two_commands() -> None:
    """The README opens with the serve and test commands."""
    head = (ROOT / "README.md").read_text().split("\n\n")[1]
    assert "make serve" in head and "make test" in head


def test_realtime_doc_lists_every_event() -> None:
    """Every Realtime client and server event type is documented in docs/realtime.md."""
    from handlers.realtime.events import REALTIME_CLIENT_TYPES, REALTIME_SERVER_TYPES

    text = (ROOT / "docs" / "realtime.md").read_text()
    for kind in REALTIME_CLIENT_TYPES | REALTIME_SERVER_TYPES:
        assert f"`{kind}`" in text, kind


def test_session_doc_shows_the_transition_table() -> None:
    """docs/session.md's table of turn states holds exactly the lifecycle's transitions."""
    import re

    from handlers.core.lifecycle import TRANSITIONS

    text = (ROOT / "docs" / "session.md").read_text()
    rows = re.findall(r"^\| `(\w+)` \| `(\w+)` \| `(\w+)` \|", text, flags=re.M)
    assert {(s, t): n for s, t, n in rows} == {(s.value, t.value): n.value for (s, t), n in TRANSITIONS.items()}
    assert len(rows) == len(TRANSITIONS)
