// The answer list: one entry per question, filled as the answer streams in.
//
// Questions carry no id on the wire; the server answers them in order, so each
// `response.start` belongs to the oldest question still waiting for one (and a `no_frames`
// error takes the place of a `response.start`), except one that names a watch as its
// trigger: that answer streams into the watch's alert (`adopt`), which no question waits for.

export class AnswerLog {
  /** @param {HTMLOListElement} list */
  constructor(list) {
    this.list = list;
    this.waiting = [];
    this.byRequest = new Map();
  }

  /** Add a question; returns its entry. */
  ask(question) {
    const item = document.createElement("li");
    item.className = "answer";
    item.dataset.status = "waiting";
    const q = document.createElement("p");
    q.className = "q";
    q.textContent = question || "(no question text)";
    const text = document.createElement("p");
    text.className = "answer-text";
    const meta = document.createElement("p");
    meta.className = "meta";
    meta.textContent = "waiting for the answer…";
    item.append(q, text, meta);
    this.list.append(item);
    const entry = { item, text, meta, sentAt: performance.now(), firstTextAt: null, requestId: null, frames: null };
    this.waiting.push(entry);
    item.scrollIntoView({ block: "nearest" });
    return entry;
  }

  /** `response.start`: bind the oldest waiting question to `requestId`. */
  start(requestId) {
    if (this.waiting.length === 0) this.ask(""); // an answer this page did not ask for
    return this.adopt(requestId, this.waiting.shift());
  }

  /**
   * Stream the answer `requestId` into `entry`, one made elsewhere (a watch's alert) with the
   * fields `ask` gives: item, text, meta, sentAt, firstTextAt, frames.
   */
  adopt(requestId, entry) {
    entry.requestId = requestId;
    entry.item.dataset.status = "streaming";
    entry.item.dataset.requestId = requestId;
    entry.meta.textContent = "answering…";
    this.byRequest.set(requestId, entry);
    return entry;
  }

  get(requestId) {
    return this.byRequest.get(requestId);
  }

  /** Append streamed text; returns the entry (or undefined for an unknown request). */
  delta(requestId, text) {
    const entry = this.byRequest.get(requestId);
    if (!entry) return undefined;
    entry.firstTextAt ??= performance.now();
    entry.text.textContent += text;
    return entry;
  }

  /** `response.done`: final status and timings. */
  done(event) {
    const entry = this.byRequest.get(event.request_id);
    if (!entry) return undefined;
    this.byRequest.delete(event.request_id);
    entry.item.dataset.status = event.status;
    const parts = [event.status];
    if (entry.firstTextAt !== null) parts.push(`first text after ${Math.round(entry.firstTextAt - entry.sentAt)} ms`);
    if (event.timings?.total_ms != null) parts.push(`total ${Math.round(event.timings.total_ms)} ms on the server`);
    if (entry.frames !== null) parts.push(`${entry.frames} frame${entry.frames === 1 ? "" : "s"} seen`);
    if (event.usage?.completion_tokens) parts.push(`${event.usage.completion_tokens} tokens`);
    entry.meta.textContent = parts.join(" · ");
    return entry;
  }

  /** A question that got an error instead of an answer. */
  failWaiting(message) {
    const entry = this.waiting.shift();
    if (!entry) return;
    entry.item.dataset.status = "failed";
    entry.meta.textContent = message;
  }

  /** The connection dropped: questions still waiting will never be answered. */
  abandon(message) {
    while (this.waiting.length) this.failWaiting(message);
    for (const entry of this.byRequest.values()) {
      entry.item.dataset.status = "interrupted";
      entry.meta.textContent = message;
    }
    this.byRequest.clear();
  }

  get running() {
    return this.byRequest.size > 0 || this.waiting.length > 0;
  }
}
