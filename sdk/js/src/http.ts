// Requests and responses as an actor sees them: the path without the
// `/<tenant>/<class>/<name>` prefix, query helpers and response builders.

import { HttpError, errorStatus, errorText } from './errors.js';
import { describe, isBytes } from './util.js';
import type { WitHeaders, WitRequest, WitResponse } from './wit-types.js';

const encoder = new TextEncoder();
const TEXT_PLAIN = 'text/plain; charset=utf-8';
const JSON_TYPE = 'application/json';

/** Headers as a list of pairs (names may repeat) or an object. */
export type HeadersInit = readonly (readonly [string, string])[] | Record<string, string>;

/** A body: bytes, or text (sent as UTF-8). */
export type BodyInit = Uint8Array | string;

function toPairs(headers: HeadersInit | undefined): [string, string][] {
  if (headers === undefined) return [];
  const pairs = Array.isArray(headers)
    ? (headers as readonly (readonly [string, string])[])
    : Object.entries(headers as Record<string, string>);
  return pairs.map(([name, value]) => [name.toLowerCase(), String(value)]);
}

function toBytes(body: BodyInit | null | undefined): Uint8Array {
  if (body === undefined || body === null) return new Uint8Array(0);
  if (typeof body === 'string') return encoder.encode(body);
  if (isBytes(body)) return body;
  throw new TypeError(`a body is a string or a Uint8Array, not ${describe(body)}`);
}

function decodeUtf8(bytes: Uint8Array, what: string): string {
  try {
    return new TextDecoder('utf-8', { fatal: true }).decode(bytes);
  } catch {
    throw HttpError.badRequest(`${what} is not valid UTF-8`);
  }
}

function findHeader(headers: readonly (readonly [string, string])[], name: string): string | undefined {
  const lower = name.toLowerCase();
  for (const [n, v] of headers) if (n.toLowerCase() === lower) return v;
  return undefined;
}

/**
 * JSON.stringify that also takes bigint: a safe integer becomes a JSON number,
 * a larger one a string (JSON numbers past 2^53 lose precision in most readers).
 */
export function stringifyJson(value: unknown): string {
  return JSON.stringify(value, (_key, v: unknown) => {
    if (typeof v !== 'bigint') return v;
    return v >= BigInt(Number.MIN_SAFE_INTEGER) && v <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(v) : v.toString();
  });
}

/**
 * An HTTP request, or a call from another actor.
 *
 * `path` is the part after `/<tenant>/<class>/<name>` (always starting with
 * `/`) without the query string, as sent (not percent-decoded); `query` is the
 * raw query string without `?`. Header names are lower-case.
 */
export class Request {
  readonly method: string;
  readonly path: string;
  readonly query: string;
  readonly headers: [string, string][];
  readonly body: Uint8Array;

  /** `pathAndQuery` may carry a query string: `/items?limit=5`. */
  constructor(method: string, pathAndQuery: string, init: { headers?: HeadersInit; body?: BodyInit } = {}) {
    const [path, query] = splitQuery(pathAndQuery);
    this.method = method.toUpperCase();
    this.path = path;
    this.query = query;
    this.headers = toPairs(init.headers);
    this.body = toBytes(init.body);
  }

  /** The request the host delivered. */
  static fromWit(request: WitRequest): Request {
    return new Request(request.method, request.path, { headers: request.headers, body: request.body });
  }

  /** The WIT shape, e.g. for `actors.call`. */
  toWit(): WitRequest {
    return {
      method: this.method,
      path: this.query === '' ? this.path : `${this.path}?${this.query}`,
      headers: this.headers.map(([n, v]) => [n, v] as [string, string]),
      body: this.body,
    };
  }

  /** The first value of header `name` (any case). */
  header(name: string): string | undefined {
    return findHeader(this.headers, name);
  }

  /** Every query parameter in order, percent-decoded (`+` is a space). */
  queryParams(): [string, string][] {
    return parseQuery(this.query);
  }

  /** The first value of query parameter `name`, percent-decoded. */
  queryParam(name: string): string | undefined {
    for (const [n, v] of this.queryParams()) if (n === name) return v;
    return undefined;
  }

  /** The body as UTF-8 text; a 400 `HttpError` when it is not UTF-8. */
  text(): string {
    return decodeUtf8(this.body, 'the body');
  }

  /** The body parsed as JSON; a 400 `HttpError` when it does not parse. */
  json<T = unknown>(): T {
    const text = this.text();
    try {
      return JSON.parse(text) as T;
    } catch (err) {
      throw HttpError.badRequest(`the body is not JSON: ${errorText(err)}`);
    }
  }
}

/** Options of a response: its status and headers. */
export interface ResponseInit {
  status?: number;
  headers?: HeadersInit;
}

/**
 * An HTTP response. `new Response(body, { status, headers })` like the web's
 * (a string body gets `content-type: text/plain; charset=utf-8` unless the
 * headers name one), or the builders `Response.text`, `Response.json`,
 * `Response.bytes`, `Response.status`, `Response.error`.
 */
export class Response {
  status: number;
  headers: [string, string][];
  body: Uint8Array;

  constructor(body?: BodyInit | null, init: ResponseInit = {}) {
    const status = init.status ?? 200;
    if (!Number.isInteger(status) || status < 100 || status > 999) {
      throw new RangeError(`HTTP status ${status} is not 100..=999`);
    }
    this.status = status;
    this.headers = toPairs(init.headers);
    if (typeof body === 'string' && findHeader(this.headers, 'content-type') === undefined) {
      this.headers.unshift(['content-type', TEXT_PLAIN]);
    }
    this.body = toBytes(body);
  }

  /** A plain-text response (`200` unless told). */
  static text(body: string, status = 200): Response {
    return new Response(body, { status, headers: [['content-type', TEXT_PLAIN]] });
  }

  /** `value` serialized as JSON (bigint as a number when safe, else a string). */
  static json(value: unknown, status = 200): Response {
    return new Response(stringifyJson(value), { status, headers: [['content-type', JSON_TYPE]] });
  }

  /** Any bytes with their content type. */
  static bytes(body: Uint8Array, contentType = 'application/octet-stream', status = 200): Response {
    return new Response(body, { status, headers: [['content-type', contentType]] });
  }

  /** An empty response with this status. */
  static status(status: number): Response {
    return new Response(null, { status });
  }

  /** A plain-text error: `status` with `message` and a newline as the body. */
  static error(status: number, message: string): Response {
    return Response.text(`${message}\n`, status);
  }

  /** `404 not found`. */
  static notFound(): Response {
    return Response.error(404, 'not found');
  }

  /** `400 bad request: <message>`. */
  static badRequest(message: string): Response {
    return Response.error(400, `bad request: ${message}`);
  }

  /** `405` with an `allow` header listing the methods the path accepts. */
  static methodNotAllowed(allowed: readonly string[]): Response {
    return Response.error(405, 'method not allowed').withHeader('allow', allowed.join(', '));
  }

  /** The response the host delivered (from `actors.call`). */
  static fromWit(response: WitResponse): Response {
    const r = new Response(response.body, { status: response.status });
    r.headers = response.headers.map(([n, v]) => [n, v] as [string, string]);
    return r;
  }

  /** The WIT shape the host takes. */
  toWit(): WitResponse {
    return { status: this.status, headers: this.headers as WitHeaders, body: this.body };
  }

  /** Replaces the status. */
  withStatus(status: number): this {
    this.status = status;
    return this;
  }

  /** Adds a header (lower-cased name) next to any of the same name (`set-cookie`). */
  withHeader(name: string, value: string): this {
    this.headers.push([name.toLowerCase(), value]);
    return this;
  }

  /** Sets a header, replacing every header of that name. */
  setHeader(name: string, value: string): this {
    const lower = name.toLowerCase();
    this.headers = this.headers.filter(([n]) => n !== lower);
    this.headers.push([lower, value]);
    return this;
  }

  /** The first value of header `name` (any case). */
  header(name: string): string | undefined {
    return findHeader(this.headers, name);
  }

  /** The body as UTF-8 text; throws (a 400 `HttpError`) when it is not. */
  text(): string {
    return decodeUtf8(this.body, 'the response body');
  }

  /** The body parsed as JSON. */
  json<T = unknown>(): T {
    return JSON.parse(this.text()) as T;
  }
}

/** What a handler may return: a Response, or text (a `200 text/plain`). */
export type HandlerResult = Response | string;

/** Turns a handler's result into a response; anything else is a TypeError. */
export function toResponse(result: unknown): Response {
  if (result instanceof Response) return result;
  if (typeof result === 'string') return Response.text(result);
  throw new TypeError(`a handler returned ${describe(result)}; return a Response or a string`);
}

/**
 * What a client is told of an error of the actor's own (a 500): its text
 * (a SQL message names tables, columns, sometimes values) goes to the log.
 */
export const INTERNAL_ERROR_TEXT = 'internal error in the actor (its log has the details)';

let reportError: (message: string) => void = () => {};

/** Where `errorResponse` sends the text of 500s (the SDK wires the host log). */
export function setErrorReporter(report: (message: string) => void): void {
  reportError = report;
}

/**
 * The response for an error a handler threw: an `HttpError` answers its
 * status and message, a failed actor call a 502; anything else is a 500 that
 * tells the client only that the actor failed and logs the error.
 */
export function errorResponse(err: unknown): Response {
  const status = errorStatus(err);
  if (status !== 500) return Response.error(status, errorText(err));
  const stack = err instanceof Error && err.stack ? `\n${err.stack}` : '';
  reportError(`answered 500: ${errorText(err)}${stack}`);
  return Response.error(500, INTERNAL_ERROR_TEXT);
}

/** Splits `/a?b=c` into `/a` and `b=c`. */
export function splitQuery(pathAndQuery: string): [string, string] {
  const at = pathAndQuery.indexOf('?');
  return at < 0 ? [pathAndQuery, ''] : [pathAndQuery.slice(0, at), pathAndQuery.slice(at + 1)];
}

/** Every `name=value` pair of a query string, percent-decoded (`+` is a space). */
export function parseQuery(query: string): [string, string][] {
  const pairs: [string, string][] = [];
  for (const pair of query.split('&')) {
    if (pair === '') continue;
    const at = pair.indexOf('=');
    if (at < 0) pairs.push([percentDecode(pair), '']);
    else pairs.push([percentDecode(pair.slice(0, at)), percentDecode(pair.slice(at + 1))]);
  }
  return pairs;
}

/**
 * Decodes `%XX` escapes, and `+` as a space when `plusIsSpace` (query
 * strings; in a path `+` is itself). Invalid escapes are kept as written;
 * invalid UTF-8 becomes U+FFFD.
 */
export function percentDecode(text: string, plusIsSpace = true): string {
  const bytes: number[] = [];
  const raw = encoder.encode(text);
  for (let i = 0; i < raw.length; i++) {
    const byte = raw[i]!;
    if (byte === 0x2b && plusIsSpace) {
      bytes.push(0x20);
    } else if (byte === 0x25 && i + 2 < raw.length) {
      const high = hexDigit(raw[i + 1]!);
      const low = hexDigit(raw[i + 2]!);
      if (high !== undefined && low !== undefined) {
        bytes.push((high << 4) | low);
        i += 2;
      } else {
        bytes.push(byte);
      }
    } else {
      bytes.push(byte);
    }
  }
  return new TextDecoder('utf-8').decode(new Uint8Array(bytes));
}

function hexDigit(byte: number): number | undefined {
  if (byte >= 0x30 && byte <= 0x39) return byte - 0x30;
  if (byte >= 0x61 && byte <= 0x66) return byte - 0x61 + 10;
  if (byte >= 0x41 && byte <= 0x46) return byte - 0x41 + 10;
  return undefined;
}
