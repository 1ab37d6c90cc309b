// The livesight page: wires the camera, microphone, connection, answers, watches and audio together.
//
// `window.livesight` exposes the running app (and the audio player's pieces) so the
// browser test can drive what a server without a voice never sends.

import { AnswerLog } from "./answers.js";
import { AudioPlayer, parseWav } from "./audio-player.js";
import { base64ToBytes, bytesToBase64 } from "./base64.js";
import { FrameSampler, listDevices, openMedia } from "./capture.js";
import { Connection } from "./connection.js";
import { Microphone } from "./microphone.js";
import { RtcConnection } from "./rtc-connection.js";
import { StreamList } from "./streams.js";
import { WatchPanel } from "./watches.js";

const $ = (id) => document.getElementById(id);

/** Frames are skipped while this much is still waiting in the socket (a slow link). */
const MAX_BUFFERED_BYTES = 2 * 1024 * 1024;

const ERROR_WORDS = {
  config_timeout: "The server waited too long for the session settings.",
  invalid_config: "The server did not accept the session settings.",
  invalid_json: "The server could not read a message from this page.",
  invalid_message: "The server could not understand a message from this page.",
  unknown_type: "The server does not know a message this page sent.",
  invalid_image: "A camera frame could not be read by the server and was skipped.",
  frame_too_large: "A camera frame was too large for the server: lower the resolution or the JPEG quality.",
  invalid_audio: "Some microphone audio was malformed and was dropped.",
  audio_overflow: "Too much microphone audio piled up without a question, so the server cleared it.",
  no_frames: "No camera frame has reached the server yet: wait a moment and ask again.",
  engine_error: "The model failed to answer this question.",
  internal_error: "The server ran into a problem while answering.",
  idle_timeout: "The server closed the session after a long silence.",
  too_many_sessions: "The server is busy with too many sessions.",
  unauthorized: "The server refused the API key.",
  forbidden_origin: "The server does not accept connections from this page's address.",
  invalid_watch: "The server did not accept that watch.",
  unknown_watch: "The server no longer holds that watch.",
  too_many_watches: "This session holds as many watches as the server allows: remove one first.",
};
const INFO_CODES = new Set(["audio_overflow", "invalid_image"]);

/** Words for a getUserMedia failure. */
function mediaErrorWords(error) {
  switch (error?.name) {
    case "NotAllowedError":
      return "Camera or microphone access was refused. Allow it in the browser's site settings, then press Start.";
    case "NotFoundError":
    case "OverconstrainedError":
      return "No camera was found (or the chosen one is gone). Pick another camera and press Start.";
    case "NotReadableError":
      return "The camera or microphone is in use by another program.";
    case "SecurityError":
      return "Camera access needs a secure page (https, or http on localhost).";
    default:
      return `The camera could not be started (${error?.message || error}).`;
  }
}

function numberFrom(input, fallback) {
  const value = Number.parseFloat(input.value);
  return Number.isFinite(value) ? value : fallback;
}

function defaultServerUrl() {
  const scheme = location.protocol === "https:" ? "wss:" : "ws:";
  const host = location.host || "127.0.0.1:8000";
  return `${scheme}//${host}/v1/video/chat/stream`;
}

class App {
  constructor() {
    this.stats = { sent: 0, accepted: 0, filtered: 0, shed: 0, skipped: 0, audioBytes: 0 };
    this.eventCounts = {};
    this.lastFrame = null;
    this.frameSeq = 0;
    this.stream = null;
    this.streaming = false;
    this.context = null;
    this.player = null;
    this.microphone = null;
    this.cancelled = new Set();
    this.answers = new AnswerLog($("answers"));
    this.watches = new WatchPanel($("watches"), $("alerts"), (watchId) => this.removeWatch(watchId));
    const hooks = {
      url: () => $("server-url").value.trim() || defaultServerUrl(),
      apiKey: () => $("api-key").value.trim(),
      config: () => this.sessionConfig(),
      onEvent: (event) => this.handleEvent(event),
      onState: (state, detail) => this.showState(state, detail),
    };
    this.watchingStream = null; // a camera the server pulls, whose session the page is attached to
    this.socket = new Connection({ ...hooks, attached: () => this.watchingStream });
    this.streamList = new StreamList($("streams"), $("streams-note"), {
      url: hooks.url,
      apiKey: hooks.apiKey,
      onWatch: (stream) => this.watchStream(stream),
    });
    this.call = RtcConnection.supported
      ? new RtcConnection({
          ...hooks,
          media: () => this.stream,
          cameraFps: () => this.videoSettings().fps,
          voice: $("voice"),
          onUnavailable: (reason) => this.fallBack(reason),
        })
      : null;
    this.connection = this.socket;
    this.sampler = new FrameSampler(
      $("preview"),
      () => this.videoSettings(),
      (frame) => this.sendFrame(frame),
      () => {
        this.stats.skipped += 1;
        this.render();
      },
    );
    $("server-url").value = defaultServerUrl();
    this.bind();
    this.render();
  }

  bind() {
    $("start").addEventListener("click", () => this.start());
    $("stop-stream").addEventListener("click", () => this.stop());
    $("ask-form").addEventListener("submit", (event) => {
      event.preventDefault();
      this.ask($("question").value);
    });
    $("cancel").addEventListener("click", () => this.cancel());
    $("streams-refresh").addEventListener("click", () => this.streamList.refresh());
    $("streams-leave").addEventListener("click", () => this.leaveStream());
    $("watch-form").addEventListener("submit", (event) => {
      event.preventDefault();
      this.addWatch($("watch-condition").value);
    });
    document.addEventListener("keydown", (event) => {
      if (event.key === "Escape" && this.answers.running) this.cancel();
    });
    $("settings-form").addEventListener("submit", (event) => {
      event.preventDefault();
      this.applySettings();
    });
    for (const id of ["camera", "microphone", "send-audio", "audio-processing"]) {
      $(id).addEventListener("change", async () => {
        if (this.streaming && (await this.restartMedia())) this.connection.mediaChanged?.();
      });
    }
  }

  // ------------------------------------------------------------------ settings
  videoSettings() {
    return {
      fps: Math.min(30, Math.max(0.1, numberFrom($("fps"), 2))),
      quality: Math.min(1, Math.max(0.1, numberFrom($("quality"), 0.8))),
      maxSide: Number($("max-side").value),
    };
  }

  /** The `session.config` message body (without its type). */
  sessionConfig() {
    const config = {
      max_frames: Math.round(Math.min(256, Math.max(1, numberFrom($("max-frames"), 50)))),
      enable_frame_filter: $("filter").checked,
      modalities: $("speak").checked ? ["text", "audio"] : ["text"],
      sampling: {
        max_tokens: Math.round(Math.min(4096, Math.max(1, numberFrom($("max-tokens"), 128)))),
        // 0 (greedy) or 0.01-2: the server refuses a temperature between 0 and 0.01
        temperature: ((t) => (t > 0 && t < 0.01 ? 0.01 : t))(Math.min(2, Math.max(0, numberFrom($("temperature"), 0)))),
      },
    };
    const threshold = Number.parseFloat($("filter-threshold").value);
    if (Number.isFinite(threshold)) config.frame_filter_threshold = Math.min(1, Math.max(0, threshold));
    const prompt = $("system-prompt").value.trim();
    if (prompt) config.system_prompt = prompt;
    if ($("turn-detection").checked) config.turn_detection = { type: "server_vad" };
    const watches = this.watches.specs();
    if (watches.length) config.watches = watches; // a new session keeps the page's watches
    return config;
  }

  applySettings() {
    this.hideMessage();
    if (this.streaming) this.connect(); // session settings only apply to a new session
  }

  /** The transport the settings ask for: WebRTC (camera and microphone as media tracks) when
   * the browser has it, else the WebSocket (frames as JPEG messages). */
  chosenConnection() {
    return $("transport").value === "webrtc" && this.call ? this.call : this.socket;
  }

  /** Open a new session on the chosen transport. */
  connect() {
    const next = this.chosenConnection();
    if (next !== this.connection) this.connection.close();
    this.connection = next;
    this.connection.open();
    if (this.connection.carriesMedia) this.sampler.stop();
    else this.sampler.start();
  }

  /** WebRTC could not reach the server: the session goes over the WebSocket instead. */
  fallBack(reason) {
    if (!this.streaming || this.connection !== this.call) return;
    this.call.close();
    this.connection = this.socket;
    this.showMessage(`A WebRTC call could not be made (${reason}); streaming over the WebSocket.`, "info", "transport");
    this.connection.open();
    this.sampler.start();
    this.render();
  }

  // ------------------------------------------------------------------ start and stop
  /** The one AudioContext, created on a click so that browsers let it play. */
  audioContext() {
    if (!this.context) {
      this.context = new AudioContext();
      this.player = new AudioPlayer(this.context);
      this.microphone = new Microphone(this.context);
    }
    if (this.context.state === "suspended") this.context.resume();
    return this.context;
  }

  /** Attach to a camera the server pulls: the page's own camera stops; questions and alerts go to that stream. */
  watchStream(stream) {
    if (this.streaming) this.stop();
    else this.connection.close();
    this.watchingStream = stream.stream_id;
    this.streamList.watching = stream.stream_id;
    this.connection = this.socket;
    this.showMessage(`Watching the server's camera "${stream.name || stream.stream_id}".`, "info", "stream");
    this.connection.open();
    this.streamList.refresh();
    this.render();
  }

  leaveStream() {
    this.watchingStream = null;
    this.streamList.watching = null;
    this.socket.close();
    this.hideMessage();
    this.streamList.refresh();
    this.render();
  }

  async start() {
    if (this.watchingStream) this.leaveStream();
    this.hideMessage();
    this.audioContext();
    if (!(await this.restartMedia())) return;
    this.streaming = true;
    this.connect();
    this.render();
  }

  /** Stop streaming on purpose: media off, session closed, no reconnect. */
  stop() {
    this.stopMedia();
    this.connection.close();
    this.answers.abandon("stopped");
    this.render();
  }

  stopMedia() {
    this.streaming = false;
    this.sampler.stop();
    this.microphone?.stop();
    this.player?.stop();
    for (const track of this.stream?.getTracks() ?? []) track.stop();
    this.stream = null;
    $("preview").srcObject = null;
  }

  /** (Re)open camera and microphone with the chosen devices; returns false on failure. */
  async restartMedia() {
    this.microphone?.stop();
    for (const track of this.stream?.getTracks() ?? []) track.stop();
    const sendAudio = $("send-audio").checked;
    try {
      this.stream = await openMedia({
        cameraId: $("camera").value,
        microphoneId: $("microphone").value,
        audio: sendAudio,
        processing: $("audio-processing").checked,
      });
    } catch (error) {
      this.showMessage(mediaErrorWords(error));
      return false;
    }
    $("preview").srcObject = this.stream;
    await this.refreshDevices();
    if (sendAudio) {
      try {
        await this.microphone.start(this.stream, (pcm) => this.sendAudio(pcm));
      } catch (error) {
        this.showMessage(`The microphone could not be captured (${error.message}); sending video only.`, "info");
      }
    }
    return true;
  }

  async refreshDevices() {
    const { cameras, microphones } = await listDevices();
    const fill = (select, devices, noun, kind) => {
      const track = this.stream?.getTracks().find((t) => t.kind === kind);
      const chosen = select.value || track?.getSettings().deviceId;
      select.replaceChildren(
        ...devices.map((device, i) => new Option(device.label || `${noun} ${i + 1}`, device.deviceId)),
      );
      if (chosen && devices.some((d) => d.deviceId === chosen)) select.value = chosen;
    };
    fill($("camera"), cameras, "Camera", "video");
    fill($("microphone"), microphones, "Microphone", "audio");
  }

  // ------------------------------------------------------------------ sending
  async sendFrame({ jpeg, width, height, ptsMs, captureTsMs }) {
    if (!this.connection.ready || this.connection.bufferedAmount > MAX_BUFFERED_BYTES) return false;
    const data = bytesToBase64(new Uint8Array(await jpeg.arrayBuffer()));
    const frameId = ++this.frameSeq;
    const sent = this.connection.send({
      type: "video.frame", data, frame_id: frameId, pts_ms: ptsMs, capture_ts_ms: captureTsMs,
    });
    if (!sent) return false;
    this.stats.sent += 1;
    this.lastFrame = { width, height, bytes: jpeg.size };
    this.render();
    return true;
  }

  sendAudio(pcm) {
    if (this.connection.carriesMedia) return; // the call's microphone track carries it
    if (!this.connection.send({ type: "audio.chunk", data: bytesToBase64(new Uint8Array(pcm)) })) return;
    this.stats.audioBytes += pcm.byteLength;
    this.render();
  }

  ask(question) {
    const text = question.trim();
    if (!text) return;
    if (!this.connection.ready) {
      this.showMessage("Not connected: press Start (or wait for the reconnect) before asking.");
      return;
    }
    this.hideMessage();
    this.player?.stop(); // a new question interrupts the current answer, its voice included
    this.answers.ask(text);
    this.connection.send({ type: "video.query", text });
    $("question").value = "";
    this.render();
  }

  /** "Tell me when…": a new alert watch (kept for the next session while not connected). */
  addWatch(condition) {
    const spec = WatchPanel.spec(condition, Number.parseFloat($("watch-threshold").value));
    if (!spec) return;
    this.hideMessage();
    if (this.connection.ready) this.connection.send({ type: "watch.create", ...spec });
    else this.watches.keep(spec);
    $("watch-condition").value = "";
  }

  removeWatch(watchId) {
    if (this.connection.ready) this.connection.send({ type: "watch.delete", watch_id: watchId });
    else this.watches.forget(watchId);
  }

  cancel() {
    for (const requestId of this.answers.byRequest.keys()) this.cancelled.add(requestId);
    this.player?.stop();
    this.connection.send({ type: "response.cancel" });
  }

  // ------------------------------------------------------------------ server events
  /** Handle one server event (also called by the browser test). */
  handleEvent(event) {
    this.eventCounts[event.type] = (this.eventCounts[event.type] ?? 0) + 1;
    switch (event.type) {
      case "session.ready":
        this.session = event;
        if (event.notes?.length) this.showMessage(event.notes.join(" "), "info");
        for (const message of this.watches.ready(event)) this.connection.send(message);
        this.showWatchNote(event.capabilities);
        break;
      case "watch.created":
        this.watches.created(event.watch);
        break;
      case "watch.updated":
        this.watches.updated(event.watch);
        break;
      case "watch.deleted":
        this.watches.deleted(event.watch_id);
        break;
      case "watch.check":
        this.watches.checked(event);
        break;
      case "watch.fired":
        this.watches.fired(event);
        break;
      case "watch.cleared":
        this.watches.cleared(event);
        break;
      case "video.frame.ack":
        if (this.connection.carriesMedia) this.stats.sent += 1; // a frame the server took from the camera track
        if (event.accepted) this.stats.accepted += 1;
        else if (event.reason === "overloaded") this.stats.shed += 1;
        else this.stats.filtered += 1;
        break;
      case "video.frames.consumed": {
        const times = event.frames.map((f) => f.capture_ts_ms).filter((t) => t != null);
        if (times.length) this.frameAgeMs = Date.now() - Math.max(...times);
        const entry = this.answers.get(event.request_id);
        if (entry) entry.frames = event.frames.length;
        break;
      }
      case "response.start":
        if (event.trigger?.type === "watch") {
          // An alert, not an answer to a question: its voice follows what is still being said.
          this.answers.adopt(event.request_id, this.watches.answerFor(event.trigger.watch_id));
        } else {
          this.player?.stop();
          this.answers.start(event.request_id);
        }
        break;
      case "response.text.delta": {
        const entry = this.answers.delta(event.request_id, event.delta);
        if (entry && !entry.alert && this.lastTtftRequest !== event.request_id) {
          this.lastTtftRequest = event.request_id;
          this.ttftMs = entry.firstTextAt - entry.sentAt;
        }
        break;
      }
      case "response.output_audio.delta":
        if (!this.cancelled.has(event.request_id)) this.playAudio(event.data);
        break;
      case "input_audio.speech_started":
        this.player?.stop(); // barge-in: the speaker talks over the answer
        break;
      case "input_audio.transcript":
        if (event.transcript) this.showMessage(`Heard: “${event.transcript}”`, "info", "transcript");
        break;
      case "response.done":
        this.lastDone = event;
        this.answers.done(event);
        this.cancelled.delete(event.request_id);
        break;
      case "error":
        this.showError(event);
        break;
      default:
        break;
    }
    this.render();
  }

  playAudio(data) {
    try {
      this.audioContext();
      this.player.enqueue(base64ToBytes(data).buffer);
    } catch (error) {
      this.showMessage(`A piece of the spoken answer could not be played (${error.message}).`, "info");
    }
  }

  showError(event) {
    const words = ERROR_WORDS[event.code] ?? "The server reported a problem.";
    if (event.code === "no_frames" || event.code === "invalid_audio") this.answers.failWaiting(words);
    const detail = event.code === "invalid_config" || !ERROR_WORDS[event.code] ? ` (${event.message})` : "";
    this.showMessage(words + detail, INFO_CODES.has(event.code) ? "info" : "error", event.code);
  }

  // ------------------------------------------------------------------ display
  showWatchNote(capabilities) {
    const note = $("watch-note");
    note.hidden = capabilities?.token_probabilities !== false;
    note.textContent = note.hidden ? "" : "This server's model cannot check watches: they are kept, but never fire.";
  }

  showState(state, detail) {
    const words = {
      idle: "Not connected",
      connecting: "Connecting…",
      ready: "Connected",
      reconnecting: `Connection lost; retrying in ${detail.retryInS} s`,
      failed: "Not connected (refused)",
    }[state];
    const badge = $("conn-state");
    badge.dataset.state = state;
    badge.textContent = words;
    $("r-state").textContent = words.toLowerCase();
    $("r-transport").textContent =
      state === "idle" ? "–" : this.watchingStream ? "the server's camera (WebSocket)" : this.connection.transport;
    if (state === "reconnecting") {
      this.answers.abandon("the connection dropped before the answer finished");
      this.showMessage(
        `The connection to the server was lost (${detail.reason}). Reconnecting in ${detail.retryInS} s.`,
        "info",
        "connection",
      );
    } else if (state === "ready") {
      if ($("error").dataset.code === "connection") this.hideMessage();
    } else if (state === "failed") {
      this.stopMedia();
      this.showMessage(`The server refused the session: ${detail.reason}`);
    }
    this.render();
  }

  showMessage(text, kind = "error", code = "") {
    const box = $("error");
    box.textContent = text;
    box.dataset.kind = kind;
    box.dataset.code = code;
    box.hidden = false;
  }

  hideMessage() {
    $("error").hidden = true;
    $("error").textContent = "";
  }

  render() {
    const { sent, accepted, filtered, shed, skipped, audioBytes } = this.stats;
    $("r-sent").textContent = String(sent);
    $("r-accepted").textContent = String(accepted);
    $("r-filtered").textContent = String(filtered);
    $("r-shed").textContent = String(shed);
    $("r-skipped").textContent = String(skipped);
    $("r-audio").textContent = `${(audioBytes / 32000).toFixed(1)} s`;
    $("r-ttft").textContent = this.ttftMs == null ? "–" : `${Math.round(this.ttftMs)} ms`;
    $("r-age").textContent = this.frameAgeMs == null ? "–" : `${Math.round(this.frameAgeMs)} ms`;
    if (this.lastFrame) {
      $("r-sent").title = `last frame ${this.lastFrame.width}×${this.lastFrame.height}, ${this.lastFrame.bytes} bytes`;
    }
    $("start").disabled = this.streaming;
    $("stop-stream").disabled = !this.streaming;
    $("streams-leave").disabled = !this.watchingStream;
    $("cancel").disabled = !this.answers.running;
  }
}

const app = new App();
window.livesight = { app, AudioPlayer, parseWav };
