// An actor's definition -> the exports the WIT world `actor` needs
// (`handler.handle`, `events.alarm`, `events.socketMessage`,
// `events.socketClose`), in the shape componentize-js expects.

import { errorText } from './errors.js';
import { type HandlerResult, Request, Response, errorResponse, toResponse } from './http.js';
import { Router } from './router.js';
import { type Message, type SocketId, fromWitMessage } from './sockets.js';
import { isPromise } from './util.js';
import type { LogLevel } from './services.js';
import type { WitEvents, WitHandler, WitRequest, WitResponse } from './wit-types.js';

type MaybePromise<T> = T | Promise<T>;

/**
 * An actor's event handlers; each is optional. The host delivers events one
 * at a time; every write an event makes commits when its handler returns
 * (or its promise settles).
 */
export interface ActorDefinition {
  /**
   * HTTP requests to `/<tenant>/<class>/<name>/...` and calls from other
   * actors: a function, or a Router. Default: 404. A thrown `HttpError`
   * answers its status; anything else a 500 (logged).
   */
  fetch?: Router | ((request: Request) => MaybePromise<HandlerResult>);
  /**
   * The alarm set for `scheduledMs` fires; `retryCount` is 0 on the first
   * delivery. Throwing (or rejecting) discards the attempt's writes and asks
   * the host to retry with backoff.
   */
  alarm?: (scheduledMs: number, retryCount: number) => MaybePromise<void>;
  /** A message from WebSocket `socket`: text as a string, binary as bytes. */
  message?: (socket: SocketId, message: Message) => MaybePromise<void>;
  /** WebSocket `socket` closed (by the client or the host). */
  close?: (socket: SocketId, code: number, reason: string) => MaybePromise<void>;
}

/** What `defineActor` returns: the component's exports. */
export interface ActorExports {
  handler: WitHandler;
  events: WitEvents;
}

/**
 * Builds the exports from a definition. `log` gets what the exports cannot
 * return (a socket handler's error).
 */
export function makeExports(definition: ActorDefinition, log: (level: LogLevel, message: string) => void): ActorExports {
  const { fetch, alarm, message, close } = definition;
  const serve: (request: Request) => MaybePromise<HandlerResult> =
    fetch instanceof Router
      ? (request) => fetch.handle(request)
      : typeof fetch === 'function'
        ? fetch
        : () => Response.notFound();

  // A socket handler has no answer to give: its error goes to the log.
  const logged = (what: string, run: () => MaybePromise<void>): MaybePromise<void> => {
    const report = (err: unknown) => log('error', `${what} failed: ${errorText(err)}`);
    try {
      const result = run();
      if (isPromise(result)) return result.catch(report);
    } catch (err) {
      report(err);
    }
  };

  return {
    handler: {
      handle(wit: WitRequest): WitResponse | Promise<WitResponse> {
        let result: MaybePromise<HandlerResult>;
        try {
          result = serve(Request.fromWit(wit));
        } catch (err) {
          return errorResponse(err).toWit();
        }
        const finish = (r: HandlerResult) => {
          try {
            return toResponse(r).toWit();
          } catch (err) {
            return errorResponse(err).toWit();
          }
        };
        if (isPromise<HandlerResult>(result)) {
          return result.then(finish, (err: unknown) => errorResponse(err).toWit());
        }
        return finish(result);
      },
    },
    events: {
      alarm(scheduledMs: bigint, retryCount: number): void | Promise<void> {
        if (alarm === undefined) return;
        // The `err` of result<_, string> is a thrown string.
        const fail = (err: unknown): never => {
          const text = errorText(err);
          log('warn', `alarm failed (retry ${retryCount}): ${text}`);
          throw text;
        };
        let result: MaybePromise<void>;
        try {
          result = alarm(Number(scheduledMs), retryCount);
        } catch (err) {
          return fail(err);
        }
        if (isPromise<void>(result)) return result.then(() => undefined, fail);
      },
      socketMessage(id, wit) {
        if (message === undefined) return;
        return logged(`socket ${id} message`, () => message(id, fromWitMessage(wit)));
      },
      socketClose(id, code, reason) {
        if (close === undefined) return;
        return logged(`socket ${id} close`, () => close(id, code, reason));
      },
    },
  };
}
