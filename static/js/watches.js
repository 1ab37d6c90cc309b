// Watches: "tell me when…" conditions the server checks as frames arrive, and the alerts
// they raise.
//
// The page keeps the session's watches (as the server runs them, from `watch.created` and
// `session.ready`) so that a new session (settings applied, a resume the server refused)
// gets them back in its `session.config`. A watch added or removed while the connection is
// down is remembered and sent once a resumed session is ready (a resumed session ignores the
// config it is sent).
//
// An alert is an entry of its own, not an answer to a question: `watch.fired` makes it
// (time, condition), and the answer whose `response.start` carries that watch's trigger
// streams into it (the page hands it to the AnswerLog, which fills any entry).

function percent(probability) {
  return Number.isFinite(probability) ? `${Math.round(probability * 100)}%` : "?";
}

/** The entry shape the AnswerLog fills: item, text, meta, sentAt, firstTextAt, frames. */
function alertEntry(list, condition, watchId, firedAt) {
  const item = document.createElement("li");
  item.className = "answer alert";
  item.dataset.status = "fired";
  item.dataset.watchId = watchId;
  const q = document.createElement("p");
  q.className = "q";
  const badge = document.createElement("span");
  badge.className = "badge";
  badge.textContent = "Alert";
  const time = document.createElement("time");
  time.dateTime = firedAt.toISOString();
  time.textContent = firedAt.toLocaleTimeString();
  const words = document.createElement("span");
  words.className = "condition";
  words.textContent = condition;
  q.append(badge, " ", time, " ", words);
  const why = document.createElement("p");
  why.className = "meta fired";
  const text = document.createElement("p");
  text.className = "answer-text";
  const meta = document.createElement("p");
  meta.className = "meta";
  meta.textContent = "answer coming…";
  item.append(q, why, text, meta);
  list.prepend(item); // the newest alert first: it is the one that matters
  return { item, why, text, meta, sentAt: performance.now(), firstTextAt: null, requestId: null, frames: null, alert: true };
}

export class WatchPanel {
  /**
   * @param {HTMLUListElement} list the active watches
   * @param {HTMLOListElement} alerts the alerts raised
   * @param {(watchId: string) => void} onRemove the remove button of a watch was pressed
   */
  constructor(list, alerts, onRemove) {
    this.list = list;
    this.alerts = alerts;
    this.onRemove = onRemove;
    this.watches = new Map(); // watch_id -> {watch, item, state}
    this.pending = []; // watches added while not connected: sent with the next session
    this.forgotten = new Set(); // ids removed while not connected: deleted once a resumed session is back
    this.firing = new Map(); // watch_id -> the alert entry waiting for its answer's response.start
  }

  /** The watch objects a new session's `session.config` carries. */
  specs() {
    return [...[...this.watches.values()].map((w) => w.watch), ...this.pending];
  }

  /** A new `watch.create` body (without its type) for `condition`, or null when it is blank. */
  static spec(condition, threshold) {
    const text = condition.trim();
    if (!text) return null;
    const spec = { condition: text, kind: "alert", report_checks: true };
    if (Number.isFinite(threshold)) {
      spec.threshold = Math.min(1, Math.max(0, threshold));
      spec.clear_threshold = Math.min(spec.threshold, 0.4); // the server refuses clear above threshold
    }
    return spec;
  }

  /** A watch added while no session is ready: it waits for the next one. */
  keep(spec) {
    this.pending.push(spec);
    this.show(null, spec, "waiting for the session");
  }

  /**
   * `session.ready`. A new session runs exactly the watches in its config; a resumed one
   * still runs what it ran, so the page returns the messages that catch it up.
   * @returns {object[]} watch.create / watch.delete messages to send now
   */
  ready(event) {
    if (!event.resumed) {
      this.pending = [];
      this.forgotten.clear();
      this.clear();
      for (const watch of event.config?.watches ?? []) this.created(watch);
      return [];
    }
    const messages = [
      ...[...this.forgotten].map((id) => ({ type: "watch.delete", watch_id: id })),
      ...this.pending.map((spec) => ({ type: "watch.create", ...spec })),
    ];
    this.forgotten.clear();
    this.pending = [];
    for (const item of this.list.querySelectorAll("li:not([data-watch-id])")) item.remove();
    return messages;
  }

  clear() {
    this.watches.clear();
    this.list.replaceChildren();
  }

  /** `watch.created` (or a watch of `session.ready`). */
  created(watch) {
    this.watches.get(watch.watch_id)?.item.remove();
    const shown = this.show(watch.watch_id, watch, "watching");
    this.watches.set(watch.watch_id, { watch, ...shown });
  }

  /** `watch.updated`. */
  updated(watch) {
    const known = this.watches.get(watch.watch_id);
    if (!known) return this.created(watch);
    known.watch = watch;
    known.words.textContent = watch.condition;
  }

  /** `watch.deleted`. */
  deleted(watchId) {
    this.watches.get(watchId)?.item.remove();
    this.watches.delete(watchId);
  }

  /** The remove button while no session is ready: forget it here, and at the server later. */
  forget(watchId) {
    if (this.watches.has(watchId)) this.forgotten.add(watchId);
    this.deleted(watchId);
  }

  /** `watch.check`: the latest probability of yes. */
  checked(event) {
    const known = this.watches.get(event.watch_id);
    if (!known) return;
    const label = known.item.dataset.state === "fired" ? "fired" : "watching";
    known.state.textContent = `${label} · yes ${percent(event.probability)}`;
  }

  /** `watch.fired`: mark the watch and make its alert entry (the answer follows). */
  fired(event) {
    const known = this.watches.get(event.watch_id);
    if (known) {
      known.item.dataset.state = "fired";
      known.state.textContent = "fired";
    }
    const entry = alertEntry(this.alerts, known?.watch.condition ?? `watch ${event.watch_id}`, event.watch_id, new Date());
    entry.why.textContent = `fired at yes ${percent(event.probability)}` +
      (event.decision_ms == null ? "" : `, ${Math.round(event.decision_ms)} ms after its frame arrived`);
    if (event.frame_id != null) entry.item.dataset.frameId = String(event.frame_id);
    this.firing.set(event.watch_id, entry);
    entry.item.scrollIntoView({ block: "nearest" });
    return entry;
  }

  /** `watch.cleared`: the condition is false again; the watch is armed. */
  cleared(event) {
    const known = this.watches.get(event.watch_id);
    if (!known) return;
    known.item.dataset.state = "armed";
    known.state.textContent = "watching (armed again)";
  }

  /** `response.start` with a watch trigger: the alert entry its answer streams into. */
  answerFor(watchId) {
    const entry = this.firing.get(watchId) ?? this.fired({ watch_id: watchId }); // its watch.fired was missed
    this.firing.delete(watchId);
    return entry;
  }

  show(watchId, watch, state) {
    const item = document.createElement("li");
    item.className = "watch";
    if (watchId) item.dataset.watchId = watchId;
    item.dataset.state = "watching";
    const words = document.createElement("span");
    words.className = "condition";
    words.textContent = watch.condition;
    const stateText = document.createElement("span");
    stateText.className = "watch-state";
    stateText.textContent = state;
    const remove = document.createElement("button");
    remove.type = "button";
    remove.className = "remove";
    remove.textContent = "Remove";
    remove.setAttribute("aria-label", `Remove watch: ${watch.condition}`);
    remove.addEventListener("click", () => {
      if (watchId) this.onRemove(watchId);
      else {
        this.pending = this.pending.filter((spec) => spec !== watch);
        item.remove();
      }
    });
    item.append(words, stateText, remove);
    this.list.append(item);
    return { item, words, state: stateText };
  }
}
