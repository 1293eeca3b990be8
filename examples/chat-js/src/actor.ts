// The chat room actor in TypeScript with @wasmkeep/sdk: the same contract
// as examples/chat (Rust), one actor per room, `/<tenant>/chat/<room>/...`.
//
//   WebSocket /ws          the host opens the socket without calling fetch, so
//                          a client names itself with a first text message
//                          `join NAME` (kept as the socket's tag). Every other
//                          text message is stored and broadcast to every socket
//                          of the room as `NAME: text`. A socket that never
//                          joined is `anon-<socket id>`. When a socket closes
//                          the room hears `NAME left`.
//   POST /post?user=NAME   the text as body: stored and broadcast the same
//                          way; returns the message id
//   GET  /history?limit=N  the last N messages (default 50, at most 1000),
//                          oldest first, as `NAME: text` lines; `&format=json`
//                          gives JSON lines {"id":1,"at_ms":...,"user":"...","text":"..."}
//   GET  /members          the names of the open sockets, one a line
//
// The room keeps its last HISTORY_MESSAGES_MAX messages.

import { HttpError, Response, Router, SqlError, defineActor, errorText, log, sockets, sql } from '@wasmkeep/sdk';
import type { SocketId } from '@wasmkeep/sdk';

// The longest user name, in bytes (a socket tag may hold 256).
const NAME_BYTES_MAX = 64;
// The longest message text, in bytes.
const TEXT_BYTES_MAX = 4096;
// Messages kept per room; older ones are deleted.
const HISTORY_MESSAGES_MAX = 10_000;
// Trim the history once every this many messages, not at each one.
const HISTORY_TRIM_EVERY = 100;
const HISTORY_LIMIT_DEFAULT = 50;
const HISTORY_LIMIT_MAX = 1000;

const CREATE =
  'CREATE TABLE IF NOT EXISTS messages(' +
  'id INTEGER PRIMARY KEY, at_ms INTEGER NOT NULL, user TEXT NOT NULL, text TEXT NOT NULL)';
const INSERT = 'INSERT INTO messages(at_ms, user, text) VALUES (?, ?, ?) RETURNING id';
const HISTORY =
  'SELECT id, at_ms, user, text FROM (SELECT * FROM messages ORDER BY id DESC LIMIT ?) ORDER BY id';

const HELP = `chat room actor (TypeScript)
  WebSocket /ws             send "join NAME" first, then text messages
  POST /post?user=NAME      body = text; broadcast and stored; returns the message id
  GET  /history?limit=N     last N messages (&format=json for JSON lines)
  GET  /members             names of the open sockets
`;

const encoder = new TextEncoder();
const bytes = (text: string) => encoder.encode(text).length;
// Unicode's control characters (category Cc), as Rust's char::is_control.
const CONTROL = /[\u0000-\u001f\u007f-\u009f]/;
const CONTROL_BUT_TAB = /[\u0000-\u0008\u000a-\u001f\u007f-\u009f]/;

const missingTable = (err: unknown) => err instanceof SqlError && err.isMissingTable;

/** A user name: 1..=64 bytes once trimmed, no control characters, no ':' (it
 * separates the name from the text in `NAME: text`). */
export function checkName(raw: string): string {
  const name = raw.trim();
  if (name.length === 0 || bytes(name) > NAME_BYTES_MAX) {
    throw HttpError.badRequest(`a user name has 1 to ${NAME_BYTES_MAX} bytes`);
  }
  if (CONTROL.test(name) || name.includes(':')) {
    throw HttpError.badRequest("a user name has no control characters and no ':'");
  }
  return name;
}

/** A message: trailing line breaks dropped, then 1..=4096 bytes with no
 * control characters but tabs. */
export function checkText(raw: string): string {
  const text = raw.replace(/[\r\n]+$/, '');
  if (text.length === 0 || bytes(text) > TEXT_BYTES_MAX) {
    throw HttpError.badRequest(`a message has 1 to ${TEXT_BYTES_MAX} bytes`);
  }
  if (CONTROL_BUT_TAB.test(text)) {
    throw HttpError.badRequest('a message has no control characters but tabs');
  }
  return text;
}

/** Stores a message, trims old history now and then, and broadcasts it. */
function post(user: string, text: string): number {
  const params = [Date.now(), user, text] as const;
  let id: number;
  try {
    id = sql.value<number>(INSERT, ...params)!;
  } catch (err) {
    if (!missingTable(err)) throw err;
    sql.execute(CREATE);
    id = sql.value<number>(INSERT, ...params)!;
  }
  if (id % HISTORY_TRIM_EVERY === 0) {
    sql.execute('DELETE FROM messages WHERE id <= ?', id - HISTORY_MESSAGES_MAX);
  }
  sockets.broadcast(`${user}: ${text}`);
  return id;
}

/** The name a socket speaks under: its tag, else `anon-<id>`. */
function socketName(socket: SocketId): string {
  return sockets.tag(socket) ?? `anon-${socket}`;
}

// The names of the sockets that joined through this instance. The host's tag
// is the durable copy; this one still answers when the host has already
// forgotten a closing socket's tag.
const names = new Map<SocketId, string>();

type Message = { id: number; at_ms: number; user: string; text: string };

const router = new Router()
  .get('/', () => HELP)
  .post('/post', (request) => {
    const user = request.queryParam('user');
    if (user === undefined) throw HttpError.badRequest('missing query parameter user');
    return String(post(checkName(user), checkText(request.text())));
  })
  .get('/history', (request) => {
    const raw = request.queryParam('limit');
    if (raw !== undefined && !/^[0-9]{1,10}$/.test(raw)) {
      throw HttpError.badRequest(`query parameter limit=${JSON.stringify(raw)} is not a whole number`);
    }
    const limit = Math.min(raw === undefined ? HISTORY_LIMIT_DEFAULT : Number(raw), HISTORY_LIMIT_MAX);
    let rows: Message[];
    try {
      rows = sql.query<Message>(HISTORY, limit);
    } catch (err) {
      if (!missingTable(err)) throw err;
      rows = [];
    }
    if (request.queryParam('format') === 'json') {
      const body = rows
        .map(({ id, at_ms, user, text }) => JSON.stringify({ id, at_ms, user, text }) + '\n')
        .join('');
      return Response.bytes(encoder.encode(body), 'application/x-ndjson');
    }
    return Response.text(rows.map(({ user, text }) => `${user}: ${text}\n`).join(''));
  })
  .get('/members', () =>
    sockets
      .list()
      .map((socket) => socketName(socket) + '\n')
      .join(''),
  );

function socketText(socket: SocketId, text: string): void {
  if (text.startsWith('join ')) {
    const name = checkName(text.slice('join '.length));
    sockets.setTag(socket, name);
    names.set(socket, name);
    sockets.broadcast(`${name} joined`);
    return;
  }
  post(socketName(socket), checkText(text));
}

export default defineActor({
  fetch: router,

  message(socket, message) {
    try {
      if (typeof message !== 'string') throw HttpError.badRequest('binary messages are not supported');
      socketText(socket, message);
    } catch (err) {
      // Tell the sender only; the room does not hear about it.
      try {
        sockets.send(socket, `error: ${errorText(err)}`);
      } catch {
        log.debug(`socket ${socket} closed before its error reply: ${errorText(err)}`);
      }
    }
  },

  close(socket) {
    const name = names.get(socket) ?? socketName(socket);
    names.delete(socket);
    sockets.broadcast(`${name} left`);
  },
});
