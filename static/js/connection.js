// The WebSocket session: connect, send session.config, reconnect after a dropped connection
// (resuming the same session with its resume_token when the server keeps dropped sessions).

/** Close-time error codes after which reconnecting cannot help. */
const FINAL_ERRORS = new Set(["invalid_config", "unauthorized", "forbidden_origin", "stream_not_found"]);
const BACKOFF_S = [1, 2, 4, 8, 15];

/**
 * This tab's routing key: every connection carries it (`?route=`), so a load balancer hashing
 * on it sends a reconnect to the gateway holding the session. Kept for the tab's life.
 */
function routeKey() {
  let key = sessionStorage.getItem("livesight.route");
  if (!key) {
    const bytes = crypto.getRandomValues(new Uint8Array(12));
    key = btoa(String.fromCharCode(...bytes)).replace(/\+/g, "-").replace(/\//g, "_");
    sessionStorage.setItem("livesight.route", key);
  }
  return key;
}

/**
 * One logical session that survives dropped connections.
 *
 * States: "idle" -> "connecting" -> "ready" (session.ready received) -> "reconnecting"
 * (dropped; a retry is scheduled) -> "connecting" ... ; "failed" when the server refused
 * the session for good; "idle" again after `close()`.
 */
export class Connection {
  /**
   * @param {{url: () => string, apiKey: () => string, config: () => object,
   *          onEvent: (event: object) => void,
   *          onState: (state: string, detail: {retryInS?: number, reason?: string}) => void}} hooks
   */
  constructor(hooks) {
    this.hooks = hooks;
    this.link = null; // the current WebSocket (or call: rtc-connection.js)
    this.state = "idle";
    this.attempt = 0;
    this.retryTimer = null;
    this.finalError = null;
    this.wanted = false;
    this.resumeToken = null; // from the last session.ready: a reconnect takes the same session back
  }

  /** The name the page shows for how it is connected. */
  get transport() {
    return "WebSocket";
  }

  /** True when camera and microphone travel as media tracks, not as messages. */
  get carriesMedia() {
    return false;
  }

  get ready() {
    return this.state === "ready" && this.link?.readyState === WebSocket.OPEN;
  }

  /** Bytes queued in the socket and not yet sent (for back-pressure). */
  get bufferedAmount() {
    return this.link ? this.link.bufferedAmount : 0;
  }

  setState(state, detail = {}) {
    this.state = state;
    this.hooks.onState(state, detail);
  }

  /** Open the session (or re-open it with the current settings). */
  open() {
    this.wanted = true;
    this.finalError = null;
    this.attempt = 0;
    this.resumeToken = null; // a new session on purpose (new settings)
    this.connect();
  }

  connect() {
    clearTimeout(this.retryTimer);
    this.detach();
    let url;
    try {
      url = new URL(this.hooks.url(), location.href);
    } catch {
      this.wanted = false;
      this.setState("failed", { reason: "The server URL is not valid." });
      return;
    }
    url.protocol = url.protocol.replace(/^http/, "ws");
    // The key goes in the query: a subprotocol that the server does not echo back makes
    // browsers fail the handshake.
    const key = this.hooks.apiKey();
    if (key) url.searchParams.set("api_key", key);
    url.searchParams.set("route", routeKey());
    const stream = this.hooks.attached?.(); // a camera the server pulls: its session, not a new one
    if (stream) url.searchParams.set("stream_id", stream);
    this.setState("connecting");
    const ws = new WebSocket(url.href);
    this.link = ws;
    ws.onopen = () => stream || ws.send(JSON.stringify(this.configMessage()));
    ws.onmessage = (message) => this.receive(message.data);
    ws.onclose = (event) => this.dropped(ws, event);
  }

  /** The first message: session.config (with the resume token of a dropped session). */
  configMessage() {
    const resume = this.resumeToken ? { resume_token: this.resumeToken } : {};
    return { type: "session.config", ...this.hooks.config(), ...resume };
  }

  receive(data) {
    let event;
    try {
      event = JSON.parse(data);
    } catch {
      return; // the server only sends JSON; anything else is not ours to show
    }
    if (event.type === "session.ready") {
      this.attempt = 0;
      this.resumeToken = event.resume_token ?? null;
      this.setState("ready");
    } else if (event.type === "error" && event.closes_session && FINAL_ERRORS.has(event.code)) {
      this.finalError = event;
    }
    this.hooks.onEvent(event);
  }

  dropped(link, event) {
    if (link !== this.link) return; // an old socket (or call) we already let go of
    this.link = null;
    if (!this.wanted) {
      this.setState("idle");
      return;
    }
    if (this.finalError) {
      this.wanted = false;
      this.setState("failed", { reason: this.finalError.message });
      return;
    }
    const retryInS = BACKOFF_S[Math.min(this.attempt, BACKOFF_S.length - 1)];
    this.attempt += 1;
    this.setState("reconnecting", { retryInS, reason: event.reason || `connection closed (code ${event.code})` });
    this.retryTimer = setTimeout(() => this.connect(), retryInS * 1000);
  }

  /**
   * Send one client event.
   * @returns {boolean} false when the session is not ready (nothing was sent)
   */
  send(event) {
    if (!this.ready) return false;
    this.link.send(JSON.stringify(event));
    return true;
  }

  detach() {
    if (!this.link) return;
    const ws = this.link;
    this.link = null;
    ws.onopen = ws.onmessage = ws.onclose = null;
    ws.close(1000);
  }

  /** End the session on purpose: no reconnect. */
  close() {
    this.wanted = false;
    clearTimeout(this.retryTimer);
    this.detach();
    this.setState("idle");
  }
}
