// "Cameras on the server": the streams the server pulls itself (GET /v1/streams), each with a
// button that attaches the page's session to it (the WebSocket with ?stream_id=): the page then
// asks about that camera and adds its alerts there, sending no camera of its own.

/** The server's HTTP origin, from the WebSocket URL in the settings. */
function httpOrigin(wsUrl) {
  const url = new URL(wsUrl, location.href);
  url.protocol = url.protocol.replace(/^ws/, "http");
  return url.origin;
}

export class StreamList {
  /**
   * @param {HTMLElement} list the <ul> to fill
   * @param {HTMLElement} note where to say what happened
   * @param {{url: () => string, apiKey: () => string, onWatch: (stream: object) => void}} hooks
   */
  constructor(list, note, hooks) {
    this.list = list;
    this.note = note;
    this.hooks = hooks;
    this.watching = null; // the stream id the page is attached to
  }

  say(text) {
    this.note.textContent = text;
    this.note.hidden = !text;
  }

  async refresh() {
    const key = this.hooks.apiKey();
    let streams;
    try {
      const response = await fetch(`${httpOrigin(this.hooks.url())}/v1/streams`, {
        headers: key ? { Authorization: `Bearer ${key}` } : {},
      });
      if (!response.ok) throw new Error(response.status === 401 ? "the server refused the API key" : `HTTP ${response.status}`);
      streams = (await response.json()).streams;
    } catch (error) {
      this.say(`The server's cameras could not be listed (${error.message}).`);
      return;
    }
    this.say(streams.length ? "" : "The server pulls no camera (POST /v1/streams adds one).");
    this.list.replaceChildren(...streams.map((stream) => this.item(stream)));
  }

  item(stream) {
    const li = document.createElement("li");
    li.dataset.streamId = stream.stream_id;
    li.dataset.state = stream.state;
    const label = document.createElement("span");
    label.className = "condition";
    label.textContent = `${stream.name || stream.stream_id} (${stream.state}, ${stream.frames_sampled} frames)`;
    const button = document.createElement("button");
    button.type = "button";
    button.className = "watch-stream";
    button.textContent = this.watching === stream.stream_id ? "Watching" : "Watch";
    button.disabled = this.watching === stream.stream_id;
    button.setAttribute("aria-label", `Watch ${stream.name || stream.stream_id}`);
    button.addEventListener("click", () => this.hooks.onWatch(stream));
    li.append(label, " ", button);
    return li;
  }
}
