"""The real server on a real socket for the socket and heavy tiers: the tiny generated model
and one server shared by the whole run.

A plugin of the root conftest. The server, the model generator and torch are imported inside
the fixtures, so a run that asks for none of them (the core and session tiers) never loads
them; the root conftest refuses a core or session test that asks for one. One plugin rather
than a copy in each folder's conftest: pytest keeps a session fixture per conftest, and each
copy would generate its own model (~20 s) and start its own server (~15 s).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from server.background import RunningServer

@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The default demo model family, generated once per test run."""
    from server.models.tiny import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny-qwen"), family="qwen2_5_vl")


@pytest.fixture(scope="session")
def server(tiny_model_dir: Path) -> Iterator[RunningServer]:
    """The real server with the real transformers engine on the tiny model."""
    from server.background import run_server
    from server.settings import Settings

    # No resume here: a test that drops a connection must not leave a parked session (and its
    # frames) behind for the next test's leak checks; tests/socket/session/test_resume.py has its own.
    # A WebRTC offer never answered is freed after 3 s, a vanished peer within about 6 s (tests/socket/webrtc).
    settings = Settings(model=str(tiny_model_dir), max_sessions=64, resume_grace_s=0, webrtc_connect_timeout_s=3,
                        webrtc_peer_timeout_s=6)
    with run_server(settings) as running:
        yield running
