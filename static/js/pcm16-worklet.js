// AudioWorklet: microphone samples -> PCM16 little-endian mono at 16 kHz, in fixed chunks.
//
// Runs on the audio thread. Channels are averaged to mono, then the context's rate
// (`sampleRate`, usually 48 kHz) is brought down to 16 kHz by averaging the input samples
// that fall into each output sample's period (a box filter: cheap, and enough against
// aliasing for speech). Each full chunk is posted to the main thread as an ArrayBuffer.

const TARGET_RATE = 16000;

class Pcm16Capture extends AudioWorkletProcessor {
  constructor(options) {
    super();
    const chunkMs = options?.processorOptions?.chunkMs ?? 100;
    this.ratio = sampleRate / TARGET_RATE;
    this.chunk = new Int16Array(Math.round((TARGET_RATE * chunkMs) / 1000));
    this.filled = 0;
    this.sum = 0;
    this.count = 0;
    this.phase = 0;
    this.last = 0;
  }

  emit(value) {
    const clamped = Math.max(-1, Math.min(1, value));
    this.chunk[this.filled++] = clamped < 0 ? clamped * 0x8000 : clamped * 0x7fff;
    if (this.filled === this.chunk.length) {
      const out = this.chunk.slice().buffer;
      this.port.postMessage(out, [out]);
      this.filled = 0;
    }
  }

  process(inputs) {
    const input = inputs[0];
    if (!input || input.length === 0) return true;
    const frames = input[0].length;
    for (let i = 0; i < frames; i++) {
      let x = 0;
      for (let c = 0; c < input.length; c++) x += input[c][i];
      x /= input.length;
      if (this.ratio <= 1) {
        // Context slower than 16 kHz (rare): repeat each input sample as often as needed.
        for (this.phase += 1 / this.ratio; this.phase >= 1; this.phase -= 1) {
          this.emit(x);
        }
        continue;
      }
      this.sum += x;
      this.count += 1;
      this.phase += 1;
      if (this.phase >= this.ratio) {
        this.phase -= this.ratio;
        this.emit(this.sum / this.count);
        this.sum = 0;
        this.count = 0;
      }
    }
    return true;
  }
}

registerProcessor("pcm16-capture", Pcm16Capture);
