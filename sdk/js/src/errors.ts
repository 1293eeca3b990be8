// The SDK's errors. Host errors carry the host's message unchanged.

/**
 * The text of anything thrown. componentize-js throws an imported function's
 * `err` value wrapped in an Error whose `payload` is that value.
 */
export function errorText(err: unknown): string {
  if (err !== null && typeof err === 'object' && 'payload' in err) {
    return String((err as { payload: unknown }).payload);
  }
  if (err instanceof Error) return err.message;
  return String(err);
}

/** SQLite (or the host) refused a statement; the message is SQLite's. */
export class SqlError extends Error {
  /** The statement that failed. */
  readonly statement: string;

  constructor(message: string, statement: string) {
    super(`sql: ${message}`);
    this.name = 'SqlError';
    this.statement = statement;
  }

  /**
   * True when SQLite said a table does not exist: lets an actor create its
   * schema lazily, only when the hot-path statement finds it missing.
   */
  get isMissingTable(): boolean {
    return this.message.includes('no such table');
  }
}

/** A parameter or a column did not convert between JavaScript and SQLite. */
export class SqlValueError extends TypeError {
  constructor(message: string) {
    super(`sql: ${message}`);
    this.name = 'SqlValueError';
  }
}

/** The host refused a socket operation (e.g. the socket is already closed). */
export class SocketError extends Error {
  readonly socket: bigint;

  constructor(socket: bigint, message: string) {
    super(`socket ${socket}: ${message}`);
    this.name = 'SocketError';
    this.socket = socket;
  }
}

/** A call to another actor failed before it produced a response. */
export class CallError extends Error {
  readonly className: string;
  readonly actorName: string;

  constructor(className: string, actorName: string, message: string) {
    super(`call to ${className}/${actorName}: ${message}`);
    this.name = 'CallError';
    this.className = className;
    this.actorName = actorName;
  }
}

/**
 * An error that is an HTTP answer: thrown from a route handler, it becomes a
 * response with its status and message (`HttpError.badRequest('...')` is a
 * 400 "bad request: ...").
 */
export class HttpError extends Error {
  readonly status: number;

  constructor(status: number, message: string) {
    super(message);
    this.name = 'HttpError';
    this.status = status;
  }

  static badRequest(message: string): HttpError {
    return new HttpError(400, `bad request: ${message}`);
  }

  static notFound(message = 'not found'): HttpError {
    return new HttpError(404, message);
  }
}

/** The HTTP status that fits an error when it ends a request. */
export function errorStatus(err: unknown): number {
  if (err instanceof HttpError) return err.status;
  if (err instanceof CallError) return 502;
  return 500;
}
