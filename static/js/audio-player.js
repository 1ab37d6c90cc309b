// Spoken answers: WAV chunks decoded here and scheduled back to back on one AudioContext.
//
// Each `response.output_audio.delta` carries a complete little WAV file (PCM16). Chunks are
// parsed synchronously (no decodeAudioData round trip, so the order and the exact length of
// every chunk are known at once) and each starts exactly where the previous one ends, so
// there is neither a gap nor an overlap. `stop()` silences everything scheduled at once.

/** Seconds of head start given to the first chunk after silence (absorbs timer jitter). */
export const LEAD_S = 0.05;

/**
 * Parse a PCM16 WAV file.
 * @param {ArrayBuffer} buffer
 * @returns {{sampleRate: number, channels: Float32Array[]}} one Float32Array per channel
 * @throws {Error} when it is not a PCM16 RIFF/WAVE file
 */
export function parseWav(buffer) {
  const view = new DataView(buffer);
  const tag = (at) => String.fromCharCode(...new Uint8Array(buffer, at, 4));
  if (buffer.byteLength < 12 || tag(0) !== "RIFF" || tag(8) !== "WAVE") {
    throw new Error("not a WAV file");
  }
  let format = null;
  let offset = 12;
  while (offset + 8 <= buffer.byteLength) {
    const id = tag(offset);
    const size = view.getUint32(offset + 4, true);
    const body = offset + 8;
    if (id === "fmt ") {
      format = {
        code: view.getUint16(body, true),
        channels: view.getUint16(body + 2, true),
        sampleRate: view.getUint32(body + 4, true),
        bits: view.getUint16(body + 14, true),
      };
    } else if (id === "data") {
      if (!format || format.code !== 1 || format.bits !== 16 || format.channels < 1) {
        throw new Error("only PCM16 WAV audio is supported");
      }
      // Streaming encoders may write 0 or 0xFFFFFFFF as the data size: take what is there.
      const available = buffer.byteLength - body;
      const bytes = size === 0 || size > available ? available : size;
      const frames = Math.floor(bytes / (2 * format.channels));
      const channels = Array.from({ length: format.channels }, () => new Float32Array(frames));
      for (let i = 0; i < frames; i++) {
        for (let c = 0; c < format.channels; c++) {
          channels[c][i] = view.getInt16(body + 2 * (i * format.channels + c), true) / 32768;
        }
      }
      return { sampleRate: format.sampleRate, channels };
    }
    offset = body + size + (size % 2);
  }
  throw new Error("WAV file has no data");
}

/** Plays WAV chunks gaplessly on one AudioContext; `stop()` cuts them off at once. */
export class AudioPlayer {
  /** @param {BaseAudioContext} context */
  constructor(context) {
    this.context = context;
    this.nextStart = 0;
    this.sources = new Set();
    /** Every chunk scheduled since the last `stop()`: {start, duration} in context seconds. */
    this.scheduled = [];
  }

  /**
   * Schedule one WAV chunk right after the previous one.
   * @param {ArrayBuffer} wav
   * @returns {{start: number, duration: number}} when it plays, in context seconds
   * @throws {Error} when the chunk is not a PCM16 WAV file
   */
  enqueue(wav) {
    const { sampleRate, channels } = parseWav(wav);
    const frames = channels[0].length;
    if (frames === 0) return { start: this.nextStart, duration: 0 };
    const buffer = this.context.createBuffer(channels.length, frames, sampleRate);
    channels.forEach((samples, c) => buffer.copyToChannel(samples, c));
    const source = this.context.createBufferSource();
    source.buffer = buffer;
    source.connect(this.context.destination);
    // Back to back with the previous chunk, unless it has already finished playing.
    const start = Math.max(this.nextStart, this.context.currentTime + LEAD_S);
    source.start(start);
    this.nextStart = start + buffer.duration;
    this.sources.add(source);
    source.onended = () => this.sources.delete(source);
    const slot = { start, duration: buffer.duration };
    this.scheduled.push(slot);
    return slot;
  }

  /** True while something is scheduled or playing. */
  get playing() {
    return this.sources.size > 0;
  }

  /** Silence everything scheduled, at once. */
  stop() {
    for (const source of this.sources) {
      source.onended = null;
      try {
        source.stop();
      } catch {
        // already stopped: nothing to silence
      }
      source.disconnect();
    }
    this.sources.clear();
    this.scheduled = [];
    this.nextStart = 0;
  }
}
