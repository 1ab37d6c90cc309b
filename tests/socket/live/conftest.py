"""The Gemini Live tests' server: the real app over TLS (a self-signed certificate made at run
time, its key encrypted with a password), with resume on and an API key required."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from server.bench.tls import self_signed

if TYPE_CHECKING:
    from server.background import RunningServer

API_KEY = "live-test-key"
OTHER_KEY = "live-test-other-key"  # a second client: a resumption handle is bound to its key
KEY_PASSWORD = b"live-test-password"


@pytest.fixture(scope="session")
def live_tls(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The certificate and (encrypted) key the Live server serves."""
    return self_signed(tmp_path_factory.mktemp("tls"), KEY_PASSWORD)


@pytest.fixture(scope="session")
def live_server(tiny_model_dir: Path, live_tls: tuple[Path, Path]) -> Iterator[RunningServer]:
    """The real server with the transformers engine on the tiny model, over TLS."""
    from server.background import run_server
    from server.settings import Settings

    cert, key = live_tls
    settings = Settings(
        model=str(tiny_model_dir), max_sessions=16, resume_grace_s=30, api_keys=[API_KEY, OTHER_KEY],
        ssl_certfile=cert, ssl_keyfile=key, ssl_keyfile_password=KEY_PASSWORD.decode(),
    )
    with run_server(settings) as running:
        yield running


@pytest.fixture
def trust_live_tls(live_tls: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> Path:
    """The SDK trusts the test certificate (it reads SSL_CERT_FILE when a client is made)."""
    monkeypatch.setenv("SSL_CERT_FILE", str(live_tls[0]))
    return live_tls[0]
