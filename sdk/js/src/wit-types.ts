// The shapes of wit/actor.wit as componentize-js (jco's bindings) presents
// them to JavaScript: s64/u64 are bigint, list<u8> is a Uint8Array, a variant
// is { tag, val }, an option<T> is T | undefined, an enum is its case name in
// kebab-case, and an imported function's `result` error is thrown.
//
// Types only: this module has no runtime code and imports no host module, so
// the pure parts of the SDK (and its unit tests) can use these shapes.

/** `sql.value`: one SQLite value. */
export type WitValue =
  | { tag: 'null'; val?: undefined }
  | { tag: 'integer'; val: bigint }
  | { tag: 'real'; val: number }
  | { tag: 'text'; val: string }
  | { tag: 'blob'; val: Uint8Array };

/** `sql.rows`. */
export interface WitRows {
  columns: string[];
  rows: WitValue[][];
}

/** `types.headers`: lower-case names; a name may repeat. */
export type WitHeaders = [string, string][];

/** `types.request`. */
export interface WitRequest {
  method: string;
  path: string;
  headers: WitHeaders;
  body: Uint8Array;
}

/** `types.response`. */
export interface WitResponse {
  status: number;
  headers: WitHeaders;
  body: Uint8Array;
}

/** `types.actor-id`. */
export interface WitActorId {
  tenant: string;
  class: string;
  name: string;
}

/** `types.message`: one WebSocket message. */
export type WitMessage = { tag: 'text'; val: string } | { tag: 'binary'; val: Uint8Array };

/** `log.level`. */
export type WitLevel = 'trace' | 'debug' | 'info' | 'warn' | 'error';

// The imported interfaces, as the SDK's pure modules receive them (host.ts
// passes the real imports; tests pass fakes). Functions whose WIT result is
// `result<T, string>` throw on error.

export interface SqlHost {
  execute(statement: string, params: WitValue[]): bigint;
  query(statement: string, params: WitValue[]): WitRows;
}

export interface AlarmHost {
  get(): bigint | undefined;
  set(atMs: bigint): void;
  clear(): void;
}

export interface SocketsHost {
  send(id: bigint, message: WitMessage): void;
  close(id: bigint, code: number, reason: string): void;
  list(): ArrayLike<bigint>;
  setTag(id: bigint, tag: string): void;
  getTag(id: bigint): string | undefined;
}

export interface ActorsHost {
  call(className: string, name: string, request: WitRequest): WitResponse;
}

export interface SecretsHost {
  get(name: string): string | undefined;
}

export interface LogHost {
  log(level: WitLevel, message: string): void;
}

export interface IdentityHost {
  id(): WitActorId;
}

/** The world's exports: what `defineActor` builds for componentize-js. */
export interface WitHandler {
  handle(request: WitRequest): WitResponse | Promise<WitResponse>;
}

export interface WitEvents {
  /** Returns normally for `ok`; throws (or rejects with) a string for `err`. */
  alarm(scheduledMs: bigint, retryCount: number): void | Promise<void>;
  socketMessage(id: bigint, message: WitMessage): void | Promise<void>;
  socketClose(id: bigint, code: number, reason: string): void | Promise<void>;
}
