// A small router: method + path patterns (`/items/:id`, `/files/*rest`) to
// handlers, with 404 and 405 answers when nothing matches.

import { HttpError } from './errors.js';
import { isPromise } from './util.js';
import { type HandlerResult, Request, Response, errorResponse, percentDecode, toResponse } from './http.js';

type Segments<P extends string> = P extends `${infer Head}/${infer Tail}` ? Segments<Head> | Segments<Tail> : P;
type ParamName<S> = S extends `:${infer Name}` ? Name : S extends `*${infer Name}` ? Name : never;

/**
 * The parameters a pattern captures, by name: `PathParams<'/items/:id'>` is
 * `{ id: string }`. Values are percent-decoded (a `+` stays a `+`).
 */
export type PathParams<P extends string> = { [K in ParamName<Segments<P>>]: string };

/** A route's handler: returns a Response or text, or a promise of one. */
export type RouteHandler<P = Record<string, string>> = (
  request: Request,
  params: P,
) => HandlerResult | Promise<HandlerResult>;

type Segment = { kind: 'literal'; text: string } | { kind: 'param'; name: string } | { kind: 'rest'; name: string };

interface Route {
  /** undefined matches every method. */
  method: string | undefined;
  segments: Segment[];
  handler: RouteHandler;
}

function parsePattern(pattern: string): Segment[] {
  const parts = pattern.split('/').filter((s) => s !== '');
  return parts.map((part, i) => {
    if (part.startsWith(':')) return { kind: 'param', name: part.slice(1) };
    if (part.startsWith('*')) {
      if (i !== parts.length - 1) throw new Error(`route ${JSON.stringify(pattern)}: ${part} must be the last segment`);
      return { kind: 'rest', name: part.slice(1) };
    }
    return { kind: 'literal', text: part };
  });
}

function matchSegments(segments: Segment[], path: string[]): Record<string, string> | undefined {
  const params: Record<string, string> = {};
  for (let i = 0; i < segments.length; i++) {
    const segment = segments[i]!;
    switch (segment.kind) {
      case 'literal':
        if (path[i] !== segment.text) return undefined;
        break;
      case 'param':
        if (path[i] === undefined) return undefined;
        params[segment.name] = percentDecode(path[i]!, false);
        break;
      case 'rest':
        params[segment.name] = percentDecode(path.slice(i).join('/'), false);
        return params;
    }
  }
  return segments.length === path.length ? params : undefined;
}

/**
 * Routes requests to handlers.
 *
 * Patterns are matched segment by segment; empty segments are ignored, so
 * `/value/` matches `/value`. `:name` captures one segment, `*name` (last
 * only) captures the rest of the path. Routes are tried in the order added.
 * A path that some route matches with another method gets `405` with an
 * `allow` header; any other path gets `404`. `HEAD` runs the `GET` route
 * (unless a route takes `HEAD` itself). A handler that throws gets the
 * answer `errorResponse` gives (an `HttpError` its status, else a 500).
 */
export class Router {
  private readonly routes: Route[] = [];

  /** Adds a route for `method` (any case; `*` for every method). */
  route<P extends string>(method: string, pattern: P, handler: RouteHandler<PathParams<P>>): this {
    this.routes.push({
      method: method === '*' ? undefined : method.toUpperCase(),
      segments: parsePattern(pattern),
      handler: handler as unknown as RouteHandler,
    });
    return this;
  }

  get<P extends string>(pattern: P, handler: RouteHandler<PathParams<P>>): this {
    return this.route('GET', pattern, handler);
  }

  post<P extends string>(pattern: P, handler: RouteHandler<PathParams<P>>): this {
    return this.route('POST', pattern, handler);
  }

  put<P extends string>(pattern: P, handler: RouteHandler<PathParams<P>>): this {
    return this.route('PUT', pattern, handler);
  }

  patch<P extends string>(pattern: P, handler: RouteHandler<PathParams<P>>): this {
    return this.route('PATCH', pattern, handler);
  }

  delete<P extends string>(pattern: P, handler: RouteHandler<PathParams<P>>): this {
    return this.route('DELETE', pattern, handler);
  }

  /** A route for every method. */
  all<P extends string>(pattern: P, handler: RouteHandler<PathParams<P>>): this {
    return this.route('*', pattern, handler);
  }

  /**
   * Runs the first route that matches, else answers 405 or 404. The answer
   * is a promise only when the handler returned one.
   */
  handle(request: Request): Response | Promise<Response> {
    const path = request.path.split('/').filter((s) => s !== '');
    const allowed: string[] = [];
    let headAsGet: [Route, Record<string, string>] | undefined;
    const head = request.method === 'HEAD';
    for (const route of this.routes) {
      const params = matchSegments(route.segments, path);
      if (params === undefined) continue;
      if (route.method !== undefined && route.method !== request.method) {
        if (head && route.method === 'GET' && headAsGet === undefined) {
          headAsGet = [route, params];
          continue;
        }
        if (!allowed.includes(route.method)) allowed.push(route.method);
        if (route.method === 'GET' && !allowed.includes('HEAD')) allowed.push('HEAD');
        continue;
      }
      return run(route, request, params);
    }
    if (headAsGet !== undefined) return run(headAsGet[0], request, headAsGet[1]);
    return allowed.length === 0 ? Response.notFound() : Response.methodNotAllowed(allowed);
  }
}

function run(route: Route, request: Request, params: Record<string, string>): Response | Promise<Response> {
  let result: HandlerResult | Promise<HandlerResult>;
  try {
    result = route.handler(request, params);
  } catch (err) {
    return errorResponse(err);
  }
  if (isPromise(result)) return result.then(toResponse).catch(errorResponse);
  try {
    return toResponse(result);
  } catch (err) {
    return errorResponse(err);
  }
}

/**
 * `text` parsed as a whole number in `min..=max` (a safe integer); a 400
 * `HttpError` naming `what` when it is not, e.g.
 * `parseInteger(params.id, 'path parameter id', { min: 0 })`.
 */
export function parseInteger(
  text: string | undefined,
  what: string,
  range: { min?: number; max?: number } = {},
): number {
  const min = range.min ?? Number.MIN_SAFE_INTEGER;
  const max = range.max ?? Number.MAX_SAFE_INTEGER;
  if (text === undefined) throw HttpError.badRequest(`missing ${what}`);
  const n = /^[+-]?[0-9]+$/.test(text) ? Number(text) : Number.NaN;
  if (!Number.isSafeInteger(n) || n < min || n > max) {
    throw HttpError.badRequest(`${what}=${JSON.stringify(text)} is not a whole number in ${min}..=${max}`);
  }
  return n;
}
