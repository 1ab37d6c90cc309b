// Base64 for binary payloads (frames out, audio in), in slices so large frames do not
// overflow the argument list of String.fromCharCode.

/** @param {Uint8Array} bytes @returns {string} */
export function bytesToBase64(bytes) {
  let text = "";
  for (let i = 0; i < bytes.length; i += 0x8000) {
    text += String.fromCharCode.apply(null, bytes.subarray(i, i + 0x8000));
  }
  return btoa(text);
}

/** @param {string} data @returns {Uint8Array} @throws {DOMException} for invalid base64 */
export function base64ToBytes(data) {
  const text = atob(data);
  const bytes = new Uint8Array(text.length);
  for (let i = 0; i < text.length; i++) bytes[i] = text.charCodeAt(i);
  return bytes;
}
