// The session over WebRTC: the camera and microphone go to the server as media tracks, the
// answers' voice comes back as one, and protocol v1's events travel on the call's "livesight"
// data channel. The page first asks the server for an ephemeral key (with the API key when one
// is set; with none on a server that needs none) and offers the call with that key alone.
// States, reconnects and resumes are Connection's; a server or browser that cannot take the
// call hands the session to the WebSocket (`onUnavailable`).

import { Connection } from "./connection.js";

const CALLS_PATH = "/v1/video/chat/calls";
const SECRETS_PATH = "/v1/realtime/client_secrets";
const CHANNEL = "livesight";
/** How long ICE candidates are gathered before the offer goes (the server takes them all at once). */
const GATHER_MS = 3000;
/** How long an answered call may take to open its channel. */
const OPEN_MS = 10000;

/** The server's HTTP origin, from the WebSocket URL in the settings. */
export function httpOrigin(wsUrl) {
  const url = new URL(wsUrl, location.href);
  url.protocol = url.protocol.replace(/^ws/, "http");
  return url.origin;
}

/** An HTTP refusal from the server, with its status. */
class Refused extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

async function refusal(response) {
  let message = `HTTP ${response.status}`;
  try {
    message = (await response.json()).error?.message || message;
  } catch {
    // not JSON: the status says it
  }
  return new Refused(response.status, message);
}

/** Resolves when ICE gathering is complete, or after GATHER_MS with what was gathered. */
function gathered(pc) {
  if (pc.iceGatheringState === "complete") return Promise.resolve();
  return new Promise((resolve) => {
    const finish = () => {
      clearTimeout(timer);
      pc.removeEventListener("icegatheringstatechange", changed);
      resolve();
    };
    const changed = () => pc.iceGatheringState === "complete" && finish();
    const timer = setTimeout(finish, GATHER_MS);
    pc.addEventListener("icegatheringstatechange", changed);
  });
}

export class RtcConnection extends Connection {
  /**
   * @param {object} hooks Connection's hooks, and `media()` (the MediaStream to send),
   *   `voice` (the <audio> element that plays the answers), `onUnavailable(reason)`.
   */
  constructor(hooks) {
    super(hooks);
    this.connectedOnce = false; // a call of this session was ready once: later failures are drops
  }

  static get supported() {
    return typeof RTCPeerConnection === "function";
  }

  get transport() {
    return "WebRTC";
  }

  get carriesMedia() {
    return true;
  }

  get ready() {
    return this.state === "ready" && this.link?.channel.readyState === "open";
  }

  get bufferedAmount() {
    return this.link ? this.link.channel.bufferedAmount : 0;
  }

  open() {
    this.connectedOnce = false;
    super.open();
  }

  connect() {
    clearTimeout(this.retryTimer);
    this.detach();
    let origin;
    try {
      origin = httpOrigin(this.hooks.url());
    } catch {
      this.wanted = false;
      this.setState("failed", { reason: "The server URL is not valid." });
      return;
    }
    this.setState("connecting");
    const pc = new RTCPeerConnection();
    const channel = pc.createDataChannel(CHANNEL);
    const link = { pc, channel, origin, key: null, location: null, openTimer: null };
    link.send = (text) => channel.send(text);
    this.link = link;
    channel.onopen = () => {
      clearTimeout(link.openTimer);
      channel.send(JSON.stringify({ ...this.configMessage(), camera_fps: this.hooks.cameraFps() }));
    };
    channel.onmessage = (message) => this.receive(message.data);
    channel.onclose = () => this.dropped(link, { code: 1006, reason: "the call ended" });
    pc.onconnectionstatechange = () => {
      if (pc.connectionState === "failed") this.dropped(link, { code: 1006, reason: "the call's connection failed" });
    };
    pc.ontrack = (event) => {
      const voice = this.hooks.voice;
      voice.srcObject = new MediaStream([event.track]);
      voice.play().catch(() => {}); // a page without a click yet may not play: the words still show
    };
    this.offer(link).catch((error) => this.setupFailed(link, error));
  }

  async offer(link) {
    const { pc } = link;
    const stream = this.hooks.media();
    const tracks = stream ? stream.getTracks() : [];
    for (const track of tracks) pc.addTrack(track, stream);
    if (!tracks.some((t) => t.kind === "audio")) pc.addTransceiver("audio", { direction: "recvonly" });
    link.key = await this.mint(link.origin);
    await pc.setLocalDescription(await pc.createOffer());
    await gathered(pc);
    if (link !== this.link) return;
    const response = await fetch(link.origin + CALLS_PATH, {
      method: "POST",
      headers: { "Content-Type": "application/sdp", Authorization: `Bearer ${link.key}` },
      body: pc.localDescription.sdp,
    });
    if (!response.ok) throw await refusal(response);
    link.location = response.headers.get("Location");
    const sdp = await response.text();
    if (link !== this.link) return;
    await pc.setRemoteDescription({ type: "answer", sdp });
    link.openTimer = setTimeout(() => this.setupFailed(link, new Error("the call did not connect")), OPEN_MS);
  }

  /** An ephemeral key from the server, for this call only. */
  async mint(origin) {
    const key = this.hooks.apiKey();
    const response = await fetch(origin + SECRETS_PATH, {
      method: "POST",
      headers: { "Content-Type": "application/json", ...(key ? { Authorization: `Bearer ${key}` } : {}) },
      body: "{}",
    });
    if (!response.ok) throw await refusal(response);
    return (await response.json()).value;
  }

  /** A call that did not come up: refused for good (a bad key), retried as a dropped one
   * (it worked before, or the server is busy), else WebRTC cannot reach this server. */
  setupFailed(link, error) {
    if (link !== this.link) return;
    const status = error instanceof Refused ? error.status : 0;
    if (status === 401 || status === 403) {
      this.finalError = { message: error.message };
      this.dropped(link, { code: 1008, reason: error.message });
    } else if (this.connectedOnce || status === 503) {
      this.dropped(link, { code: 1006, reason: error.message });
    } else {
      this.release(link);
      this.link = null;
      this.hooks.onUnavailable(error.message);
    }
  }

  receive(data) {
    super.receive(data);
    if (this.state === "ready") this.connectedOnce = true;
  }

  /** The camera or microphone changed: the call sends the new tracks. */
  mediaChanged() {
    const stream = this.hooks.media();
    if (!this.link || !stream) return;
    for (const sender of this.link.pc.getSenders()) {
      const track = sender.track && stream.getTracks().find((t) => t.kind === sender.track.kind);
      if (track) sender.replaceTrack(track).catch(() => {});
    }
  }

  dropped(link, event) {
    if (link === this.link) this.release(link);
    super.dropped(link, event);
  }

  release(link) {
    clearTimeout(link.openTimer);
    link.channel.onopen = link.channel.onmessage = link.channel.onclose = null;
    link.pc.onconnectionstatechange = link.pc.ontrack = null;
    link.pc.close();
  }

  /** Let the call go on purpose: hung up, so its session ends for good. */
  detach() {
    const link = this.link;
    if (!link) return;
    this.link = null;
    this.release(link);
    if (link.location) {
      fetch(`${link.origin}${link.location}/hangup`, {
        method: "POST",
        headers: { Authorization: `Bearer ${link.key}` },
        keepalive: true,
      }).catch(() => {});
    }
  }
}
