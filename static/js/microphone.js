// Microphone capture: a MediaStream's audio track -> PCM16 16 kHz mono chunks.

/** Milliseconds of audio per `audio.chunk` message. */
export const CHUNK_MS = 100;

/** Feeds a stream's audio through the PCM16 worklet; `onChunk(ArrayBuffer)` gets each chunk. */
export class Microphone {
  /** @param {AudioContext} context  the page's one AudioContext */
  constructor(context) {
    this.context = context;
    this.source = null;
    this.node = null;
    this.sink = null;
    this.loaded = null;
  }

  /**
   * Start capturing `stream`'s audio.
   * @param {MediaStream} stream
   * @param {(pcm: ArrayBuffer) => void} onChunk
   * @throws {Error} when the stream has no audio track or the worklet cannot load
   */
  async start(stream, onChunk) {
    this.stop();
    if (stream.getAudioTracks().length === 0) throw new Error("the stream has no microphone track");
    this.loaded ??= this.context.audioWorklet.addModule(new URL("./pcm16-worklet.js", import.meta.url));
    await this.loaded;
    this.source = this.context.createMediaStreamSource(stream);
    this.node = new AudioWorkletNode(this.context, "pcm16-capture", {
      numberOfInputs: 1,
      numberOfOutputs: 1,
      channelCount: 1,
      channelCountMode: "explicit",
      processorOptions: { chunkMs: CHUNK_MS },
    });
    this.node.port.onmessage = (event) => onChunk(event.data);
    // A silent sink keeps the node in the rendered graph without playing the microphone.
    this.sink = this.context.createGain();
    this.sink.gain.value = 0;
    this.source.connect(this.node).connect(this.sink).connect(this.context.destination);
  }

  /** Stop capturing (the stream's tracks are left to their owner). */
  stop() {
    if (this.node) this.node.port.onmessage = null;
    for (const node of [this.source, this.node, this.sink]) node?.disconnect();
    this.source = this.node = this.sink = null;
  }
}
