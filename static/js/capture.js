// Camera and microphone access, and the frame sampler that turns the preview into JPEGs.

/**
 * Open the camera and (optionally) the microphone.
 * @param {{cameraId?: string, microphoneId?: string, audio: boolean, processing: boolean}} options
 *   `processing` turns the browser's echo cancellation, noise suppression and gain control on.
 * @returns {Promise<MediaStream>}
 * @throws {DOMException} from getUserMedia (permission denied, no device, device busy)
 */
export async function openMedia({ cameraId, microphoneId, audio, processing }) {
  const video = {
    width: { ideal: 1280 },
    height: { ideal: 720 },
    ...(cameraId ? { deviceId: { exact: cameraId } } : {}),
  };
  const mic = audio
    ? {
        channelCount: 1,
        echoCancellation: processing,
        noiseSuppression: processing,
        autoGainControl: processing,
        ...(microphoneId ? { deviceId: { exact: microphoneId } } : {}),
      }
    : false;
  return navigator.mediaDevices.getUserMedia({ video, audio: mic });
}

/**
 * The cameras and microphones the browser offers (labels appear once permission is given).
 * @returns {Promise<{cameras: MediaDeviceInfo[], microphones: MediaDeviceInfo[]}>}
 */
export async function listDevices() {
  const devices = await navigator.mediaDevices.enumerateDevices();
  return {
    cameras: devices.filter((d) => d.kind === "videoinput"),
    microphones: devices.filter((d) => d.kind === "audioinput"),
  };
}

/** The size a frame is encoded at: the video's, scaled down so its longest side is <= maxSide. */
export function frameSize(width, height, maxSide) {
  const scale = maxSide > 0 ? Math.min(1, maxSide / Math.max(width, height)) : 1;
  return { width: Math.max(1, Math.round(width * scale)), height: Math.max(1, Math.round(height * scale)) };
}

/**
 * Grabs a JPEG from a <video> at a steady rate.
 *
 * `settings()` is read at every tick, so rate, quality and size changes apply at once.
 * A tick is skipped (and counted) while the previous frame is still being encoded or when
 * `onFrame` reports that it could not send, so a slow link never builds a backlog.
 */
export class FrameSampler {
  /**
   * @param {HTMLVideoElement} video
   * @param {() => {fps: number, quality: number, maxSide: number}} settings
   * @param {(frame: {jpeg: Blob, width: number, height: number, ptsMs: number, captureTsMs: number}) => Promise<boolean>} onFrame
   *   resolves to false when the frame was not sent
   * @param {() => void} onSkip  called for each skipped tick
   */
  constructor(video, settings, onFrame, onSkip) {
    this.video = video;
    this.settings = settings;
    this.onFrame = onFrame;
    this.onSkip = onSkip;
    this.canvas = document.createElement("canvas");
    this.timer = null;
    this.busy = false;
    this.origin = 0;
    this.nextTick = 0;
  }

  get running() {
    return this.timer !== null;
  }

  start() {
    if (this.running) return;
    this.origin = performance.now();
    this.nextTick = this.origin;
    this.schedule();
  }

  stop() {
    clearTimeout(this.timer);
    this.timer = null;
  }

  schedule() {
    const interval = 1000 / Math.min(30, Math.max(0.1, this.settings().fps || 2));
    // Ticks are anchored to a grid, not to the previous tick, so the rate does not drift.
    const now = performance.now();
    this.nextTick = Math.max(this.nextTick + interval, now);
    this.timer = setTimeout(() => this.tick(), this.nextTick - now);
  }

  async tick() {
    this.schedule();
    if (this.busy || this.video.readyState < HTMLMediaElement.HAVE_CURRENT_DATA || !this.video.videoWidth) {
      this.onSkip();
      return;
    }
    this.busy = true;
    try {
      const { quality, maxSide } = this.settings();
      const { width, height } = frameSize(this.video.videoWidth, this.video.videoHeight, maxSide);
      const ptsMs = Math.round(performance.now() - this.origin);
      const captureTsMs = Date.now();
      this.canvas.width = width;
      this.canvas.height = height;
      this.canvas.getContext("2d").drawImage(this.video, 0, 0, width, height);
      const jpeg = await new Promise((resolve) => this.canvas.toBlob(resolve, "image/jpeg", quality));
      if (!jpeg || !(await this.onFrame({ jpeg, width, height, ptsMs, captureTsMs }))) this.onSkip();
    } finally {
      this.busy = false;
    }
  }
}
