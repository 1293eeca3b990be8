// @wasmkeep/sdk: write wasmkeep actors in TypeScript.
//
// This module wires the pure parts to the host (src/host.ts, the only module
// that imports `wasmkeep:*`); it can only be loaded inside a component.

import { createAlarm } from './alarm.js';
import { type ActorDefinition, type ActorExports, makeExports } from './define.js';
import { actorsHost, alarmHost, identityHost, logHost, secretsHost, socketsHost, sqlHost } from './host.js';
import { setErrorReporter } from './http.js';
import { createSockets } from './sockets.js';
import { createActors, createIdentity, createLog, createSecrets } from './services.js';
import { Sql } from './sql.js';

/** The actor's SQLite database (INTEGER as number; `sql.bigint` for bigint). */
export const sql: Sql = new Sql(sqlHost);
/** The actor's one alarm. */
export const alarm = createAlarm(alarmHost);
/** The actor's open WebSockets. */
export const sockets = createSockets(socketsHost);
/** Calls to other actors of the same tenant. */
export const actors = createActors(actorsHost);
/** The app's secrets. */
export const secrets = createSecrets(secretsHost);
/** The host's log, tagged with the actor's id. */
export const log = createLog(logHost);
/** Who this actor is: `{ tenant, class, name }`. */
export const actorId = createIdentity(identityHost);

setErrorReporter((message) => log.error(message));


/**
 * Defines the actor: `export default defineActor({ fetch, alarm, message, close })`.
 * Returns the component's exports (`handler`, `events`); `wasmkeep-build`
 * exports them from the default export. Without wasmkeep-build, write
 * `export const { handler, events } = defineActor({...})`.
 */
export function defineActor(definition: ActorDefinition): ActorExports {
  return makeExports(definition, (level, message) => log.log(level, message));
}

export type { ActorDefinition, ActorExports } from './define.js';
export type { Alarm } from './alarm.js';
export type { Message, SocketId, Sockets } from './sockets.js';
export type { ActorId, Actors, CallInit, Log, LogLevel, Secrets } from './services.js';
export type { IntegerMode, Row, SqlOutput, SqlParam, SqlValue } from './sql.js';
export type { BodyInit, HandlerResult, HeadersInit, ResponseInit } from './http.js';
export type { PathParams, RouteHandler } from './router.js';
export { Sql } from './sql.js';
export { Request, Response, INTERNAL_ERROR_TEXT, errorResponse, parseQuery, percentDecode } from './http.js';
export { Router, parseInteger } from './router.js';
export { CallError, HttpError, SocketError, SqlError, SqlValueError, errorText } from './errors.js';
