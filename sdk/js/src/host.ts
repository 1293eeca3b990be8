// The thin layer over the host: the only module that imports `wasmkeep:*`.
// Everything else in the SDK is pure and takes these objects as arguments,
// which is what lets the unit tests run in Node with fakes.

// Named imports, as componentize-js resolves them.
import { execute, query } from 'wasmkeep:actor/sql@0.1.0';
import { clear as clearAlarm, get as getAlarm, set as setAlarm } from 'wasmkeep:actor/alarm@0.1.0';
import { close, getTag, list, send, setTag } from 'wasmkeep:actor/sockets@0.1.0';
import { call } from 'wasmkeep:actor/actors@0.1.0';
import { get as getSecret } from 'wasmkeep:actor/secrets@0.1.0';
import { log } from 'wasmkeep:actor/log@0.1.0';
import { id } from 'wasmkeep:actor/identity@0.1.0';
import type {
  ActorsHost,
  AlarmHost,
  IdentityHost,
  LogHost,
  SecretsHost,
  SocketsHost,
  SqlHost,
} from './wit-types.js';

export const sqlHost: SqlHost = {
  execute: (statement, params) => execute(statement, params),
  query: (statement, params) => query(statement, params),
};

export const alarmHost: AlarmHost = {
  get: () => getAlarm(),
  set: (atMs) => setAlarm(atMs),
  clear: () => clearAlarm(),
};

export const socketsHost: SocketsHost = {
  send: (id, message) => send(id, message),
  close: (id, code, reason) => close(id, code, reason),
  list: () => list(),
  setTag: (id, tag) => setTag(id, tag),
  getTag: (id) => getTag(id),
};

export const actorsHost: ActorsHost = {
  call: (className, name, request) => call(className, name, request),
};

export const secretsHost: SecretsHost = {
  get: (name) => getSecret(name),
};

export const logHost: LogHost = {
  log: (level, message) => log(level, message),
};

export const identityHost: IdentityHost = {
  id: () => id(),
};
