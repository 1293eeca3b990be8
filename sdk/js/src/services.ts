// Actor calls, secrets, the log and identity: thin typed wrappers.

import { CallError, errorText } from './errors.js';
import { type BodyInit, type HeadersInit, Request, Response } from './http.js';
import type { ActorsHost, IdentityHost, LogHost, SecretsHost, WitLevel } from './wit-types.js';

/** A request to another actor: a Request, or its parts. */
export type CallInit = Request | { method?: string; path: string; headers?: HeadersInit; body?: BodyInit };

export interface Actors {
  /**
   * Sends a request to actor `className/name` of this tenant and waits for
   * its response (the callee sees it in its fetch). A CallError when the
   * call fails before a response (an actor's error answer is a response).
   */
  call(className: string, name: string, request: CallInit): Response;
}

export function createActors(host: ActorsHost): Actors {
  return {
    call(className, name, init) {
      const request =
        init instanceof Request
          ? init
          : new Request(init.method ?? 'GET', init.path, { headers: init.headers, body: init.body });
      try {
        return Response.fromWit(host.call(className, name, request.toWit()));
      } catch (err) {
        throw new CallError(className, name, errorText(err));
      }
    },
  };
}

export interface Secrets {
  /** The app's secret `name`, or undefined when there is none. */
  get(name: string): string | undefined;
}

export function createSecrets(host: SecretsHost): Secrets {
  return { get: (name) => host.get(name) };
}

/** Log levels, least severe first. */
export type LogLevel = WitLevel;

/**
 * Logging through the host, which tags each line with the actor's id. Every
 * function takes any values: strings are written as they are, errors with
 * their stack, other values as JSON (bigint as digits), joined by spaces.
 */
export interface Log {
  log(level: LogLevel, ...parts: unknown[]): void;
  trace(...parts: unknown[]): void;
  debug(...parts: unknown[]): void;
  info(...parts: unknown[]): void;
  warn(...parts: unknown[]): void;
  error(...parts: unknown[]): void;
}

/** The text of log parts. */
export function formatLog(parts: readonly unknown[]): string {
  return parts
    .map((part) => {
      if (typeof part === 'string') return part;
      if (part instanceof Error) return part.stack ?? `${part.name}: ${part.message}`;
      if (part === undefined || typeof part === 'function' || typeof part === 'symbol') return String(part);
      try {
        return JSON.stringify(part, (_k, v: unknown) => (typeof v === 'bigint' ? v.toString() : v)) ?? String(part);
      } catch {
        return String(part);
      }
    })
    .join(' ');
}

export function createLog(host: LogHost): Log {
  const at =
    (level: LogLevel) =>
    (...parts: unknown[]) =>
      host.log(level, formatLog(parts));
  return {
    log: (level, ...parts) => host.log(level, formatLog(parts)),
    trace: at('trace'),
    debug: at('debug'),
    info: at('info'),
    warn: at('warn'),
    error: at('error'),
  };
}

/** Who an actor is: `tenant/class/name`. */
export interface ActorId {
  tenant: string;
  class: string;
  name: string;
}

export function createIdentity(host: IdentityHost): () => ActorId {
  return () => {
    const { tenant, class: className, name } = host.id();
    return { tenant, class: className, name };
  };
}
