// Declarations of the `wasmkeep:actor/*` modules for the TypeScript compiler,
// written by hand from wit/actor.wit. componentize-js provides the real
// modules when it builds the component; only src/host.ts imports them.

declare module 'wasmkeep:actor/sql@0.1.0' {
  import type { WitRows, WitValue } from './wit-types.js';
  /** Throws the host's error text (in `.payload`) on `err`. */
  export function execute(statement: string, params: WitValue[]): bigint;
  export function query(statement: string, params: WitValue[]): WitRows;
}

declare module 'wasmkeep:actor/alarm@0.1.0' {
  export function get(): bigint | undefined;
  export function set(atMs: bigint): void;
  export function clear(): void;
}

declare module 'wasmkeep:actor/sockets@0.1.0' {
  import type { WitMessage } from './wit-types.js';
  export function send(id: bigint, message: WitMessage): void;
  export function close(id: bigint, code: number, reason: string): void;
  export function list(): BigUint64Array | bigint[];
  export function setTag(id: bigint, tag: string): void;
  export function getTag(id: bigint): string | undefined;
}

declare module 'wasmkeep:actor/actors@0.1.0' {
  import type { WitRequest, WitResponse } from './wit-types.js';
  export function call(className: string, name: string, request: WitRequest): WitResponse;
}

declare module 'wasmkeep:actor/secrets@0.1.0' {
  export function get(name: string): string | undefined;
}

declare module 'wasmkeep:actor/log@0.1.0' {
  import type { WitLevel } from './wit-types.js';
  export function log(level: WitLevel, message: string): void;
}

declare module 'wasmkeep:actor/identity@0.1.0' {
  import type { WitActorId } from './wit-types.js';
  export function id(): WitActorId;
}
