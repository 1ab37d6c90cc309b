"""The Python client of protocol v1: ``connection`` (the one typed client), ``stream`` (the
resumable session client), ``sources`` (frames of a video file or image folder) and ``runner``
(``livesight stream``: a source played into a session, its answers printed)."""
