"""The livesight container's health check: GET /healthz on this container's server.

livesight serves every endpoint over TLS when ``LIVESIGHT_SSL_CERTFILE`` is set, so the check
asks over https then, and over plain http otherwise. It does not verify the certificate: a
self-signed one, or one issued for the public host name, is fine; the check only asks whether
the server answers. The port is ``LIVESIGHT_PORT`` (the image sets 8000).

    python3 /opt/livesight/docker/healthcheck.py     # exit status 0: healthy, 1: not

Standard library only: it runs every few seconds inside the container.
"""

from __future__ import annotations

import os
import ssl
import sys
import urllib.request
from collections.abc import Mapping


def health_url(env: Mapping[str, str]) -> str:
    """The URL of the server's ``/healthz`` in the container whose environment is ``env``."""
    scheme = "https" if env.get("LIVESIGHT_SSL_CERTFILE") else "http"
    port = env.get("LIVESIGHT_PORT") or "8000"
    return f"{scheme}://127.0.0.1:{port}/healthz"


def healthy(url: str, timeout_s: float = 4.0) -> bool:
    """True when ``url`` answers 200 within ``timeout_s``; prints why not to stderr otherwise."""
    context = None
    if url.startswith("https:"):
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    try:
        with urllib.request.urlopen(url, timeout=timeout_s, context=context) as response:
            return response.status == 200
    except OSError as error:  # refused, timed out, TLS handshake failed, HTTP error status
        print(f"{url}: {error}", file=sys.stderr)
        return False


if __name__ == "__main__":
    sys.exit(0 if healthy(health_url(os.environ)) else 1)
