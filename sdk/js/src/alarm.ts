// The actor's one alarm. Times are milliseconds since the Unix epoch, as
// numbers (a time in ms is far inside 2^53). Setting replaces any alarm
// already set and commits with the current event.

import type { AlarmHost } from './wit-types.js';

const S64_MIN = -(2n ** 63n);
const S64_MAX = 2n ** 63n - 1n;

function toMs(at: number | bigint | Date, what: string): bigint {
  if (at instanceof Date) at = at.getTime();
  if (typeof at === 'number') {
    if (!Number.isInteger(at)) throw new RangeError(`${what}: ${at} is not a whole number of milliseconds`);
    at = BigInt(at);
  }
  if (at < S64_MIN || at > S64_MAX) throw new RangeError(`${what}: ${at} does not fit a signed 64-bit integer`);
  return at;
}

export interface Alarm {
  /** When the alarm fires next (ms since the epoch), or undefined. */
  get(): number | undefined;
  /** Sets the alarm for `at` (ms since the epoch, or a Date); a past time fires at once. Returns the time set. */
  set(at: number | bigint | Date): number;
  /** Sets the alarm `delayMs` from now (`Date.now()`); returns the time set. */
  setIn(delayMs: number): number;
  /** Removes the alarm, if one is set. */
  clear(): void;
}

export function createAlarm(host: AlarmHost, now: () => number = Date.now): Alarm {
  return {
    get() {
      const at = host.get();
      return at === undefined ? undefined : Number(at);
    },
    set(at) {
      const ms = toMs(at, 'alarm.set');
      host.set(ms);
      return Number(ms);
    },
    setIn(delayMs) {
      if (!Number.isInteger(delayMs)) throw new RangeError(`alarm.setIn: ${delayMs} is not a whole number of milliseconds`);
      const ms = toMs(BigInt(now()) + BigInt(delayMs), 'alarm.setIn');
      host.set(ms);
      return Number(ms);
    },
    clear() {
      host.clear();
    },
  };
}
