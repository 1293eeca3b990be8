/** True for a promise (any thenable). */
export function isPromise<T>(value: unknown): value is Promise<T> {
  return value !== null && typeof value === 'object' && typeof (value as { then?: unknown }).then === 'function';
}

/** The name of a value's type, for error messages. */
export function describe(value: unknown): string {
  if (value === null) return 'null';
  if (typeof value === 'object') return (value as object).constructor?.name ?? 'object';
  return typeof value;
}

/**
 * True for a Uint8Array. Not `instanceof`: the byte arrays componentize-js
 * hands over (a request's body, a blob) come from another realm and fail it.
 */
export function isBytes(value: unknown): value is Uint8Array {
  return Object.prototype.toString.call(value) === '[object Uint8Array]';
}

/** True for an ArrayBuffer, from any realm. */
export function isArrayBuffer(value: unknown): value is ArrayBuffer {
  return Object.prototype.toString.call(value) === '[object ArrayBuffer]';
}
