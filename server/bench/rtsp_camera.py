#!/usr/bin/python3
"""An RTSP camera for the tests and ``bench cameras``: Debian's GStreamer RTSP server, run by
the system Python (its GObject bindings are Debian packages, not in the project's venv).

    /usr/bin/python3 -I rtsp_camera.py PORT NAME=CLIP.mp4 [NAME=CLIP.mp4 ...]

serves each H.264 MP4 at ``rtsp://127.0.0.1:PORT/NAME`` as it is (no encoding: parsed and
packetised only), over TCP and UDP, and prints ``ready PORT`` once it listens (PORT 0: the
system picks one, so parallel runs never race for a port). A clip that ends
ends its clients' streams (a camera that hangs up).
"""

import sys

import gi

gi.require_version("Gst", "1.0")
gi.require_version("GstRtspServer", "1.0")
from gi.repository import GLib, Gst, GstRtspServer  # noqa: E402


def main() -> None:
    Gst.init(None)
    port, mounts = sys.argv[1], sys.argv[2:]
    server = GstRtspServer.RTSPServer()
    server.set_address("127.0.0.1")
    server.set_service(port)
    points = server.get_mount_points()
    for mount in mounts:
        name, _, path = mount.partition("=")
        factory = GstRtspServer.RTSPMediaFactory()
        factory.set_launch(f"( filesrc location={path} ! qtdemux ! h264parse ! rtph264pay name=pay0 pt=96 config-interval=1 )")
        factory.set_shared(True)
        points.add_factory("/" + name, factory)
    if server.attach(None) == 0:
        sys.exit(f"could not listen on port {port}")
    print(f"ready {server.get_bound_port()}", flush=True)
    GLib.MainLoop().run()


if __name__ == "__main__":
    main()
