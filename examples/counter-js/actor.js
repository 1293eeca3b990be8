// The counter actor in JavaScript: the same HTTP and WebSocket contract as
// examples/counter (Rust), against the same WIT (wit/actor.wit), built into a
// component by componentize-js (see build.sh).
//
//   POST /increment      add one; returns the new count as plain text
//   GET  /value          the count (0 before the first increment)
//   POST /alarm?in_ms=N  set the alarm N ms ahead; returns its time (ms since the epoch)
//   GET  /alarms         how many times the alarm has fired
//   GET  /fetch?url=U    fetch() U (outbound HTTP: only what the class's
//                        deploy allows, ADR 0066); answers its status and body,
//                        or 502 with the error
//   WebSocket /ws        each text message "inc" is answered with the new count;
//                        any other message is echoed back
//
// Mapping of WIT to JS (componentize-js / jco): s64 and u64 are BigInt, list<u8>
// is a Uint8Array, a variant is { tag, val }, an imported function's `result`
// error is thrown, and an exported function returns its `ok` value or throws
// its `err` value.

import { execute, query } from 'wasmkeep:actor/sql@0.1.0';
import { set as setAlarm } from 'wasmkeep:actor/alarm@0.1.0';
import { send } from 'wasmkeep:actor/sockets@0.1.0';
import { log } from 'wasmkeep:actor/log@0.1.0';

// The row of the request count and the row of the alarm count.
const INCREMENTS = 1n;
const ALARMS = 2n;
// The furthest ahead an alarm may be set: a year.
const ALARM_DELAY_MS_MAX = 366 * 24 * 3600 * 1000;

const CREATE = 'CREATE TABLE IF NOT EXISTS counter(id INTEGER PRIMARY KEY, n INTEGER NOT NULL)';
const INCREMENT =
  'INSERT INTO counter(id, n) VALUES (?, 1) ON CONFLICT(id) DO UPDATE SET n = n + 1 RETURNING n';
const VALUE = 'SELECT n FROM counter WHERE id = ?';

const HELP = `counter actor (JavaScript)
  POST /increment        add one; returns the new count
  GET  /value            the count
  POST /alarm?in_ms=N    set the alarm N ms ahead; returns its time (ms since the epoch)
  GET  /alarms           how many times the alarm has fired
  GET  /fetch?url=U      fetch() U; its status and body
  WebSocket /ws          send "inc", receive the new count
`;

const encoder = new TextEncoder();

function errorText(err) {
  // An imported function's `err` value travels in `payload` (or is the thrown value).
  if (err && typeof err === 'object' && 'payload' in err) return String(err.payload);
  if (err instanceof Error) return err.message;
  return String(err);
}

function isMissingTable(err) {
  return errorText(err).includes('no such table');
}

// Adds one to row `id` and returns its new value: one statement, plus the
// table's creation when that statement finds it missing.
function increment(id) {
  const params = [{ tag: 'integer', val: id }];
  let rows;
  try {
    rows = query(INCREMENT, params);
  } catch (err) {
    if (!isMissingTable(err)) throw err;
    execute(CREATE, []);
    rows = query(INCREMENT, params);
  }
  return rows.rows[0][0].val;
}

// The value of row `id`; 0 before its first increment.
function value(id) {
  let rows;
  try {
    rows = query(VALUE, [{ tag: 'integer', val: id }]);
  } catch (err) {
    if (isMissingTable(err)) return 0n;
    throw err;
  }
  return rows.rows.length === 0 ? 0n : rows.rows[0][0].val;
}

function text(body, status = 200) {
  return {
    status,
    headers: [['content-type', 'text/plain; charset=utf-8']],
    body: encoder.encode(body),
  };
}

function queryParam(queryString, name) {
  for (const pair of queryString.split('&')) {
    const at = pair.indexOf('=');
    const key = decodeURIComponent((at < 0 ? pair : pair.slice(0, at)).replace(/\+/g, ' '));
    if (key === name) {
      return at < 0 ? '' : decodeURIComponent(pair.slice(at + 1).replace(/\+/g, ' '));
    }
  }
  return undefined;
}

function route(method, path, queryString) {
  const known = {
    '/': ['GET'],
    '/increment': ['POST'],
    '/value': ['GET'],
    '/alarm': ['POST'],
    '/alarms': ['GET'],
  };
  const allowed = known[path.length > 1 ? path.replace(/\/+$/, '') : path];
  if (!allowed) return text('not found\n', 404);
  if (!allowed.includes(method)) {
    const response = text('method not allowed\n', 405);
    response.headers.push(['allow', allowed.join(', ')]);
    return response;
  }
  switch (path.replace(/\/+$/, '') || '/') {
    case '/':
      return text(HELP);
    case '/increment':
      return text(String(increment(INCREMENTS)));
    case '/value':
      return text(String(value(INCREMENTS)));
    case '/alarms':
      return text(String(value(ALARMS)));
    case '/alarm': {
      const raw = queryParam(queryString, 'in_ms');
      if (raw === undefined) return text('bad request: missing query parameter in_ms\n', 400);
      if (!/^[0-9]+$/.test(raw) || Number(raw) > ALARM_DELAY_MS_MAX) {
        return text(`bad request: in_ms=${JSON.stringify(raw)} is not 0..=${ALARM_DELAY_MS_MAX}\n`, 400);
      }
      const atMs = BigInt(Date.now()) + BigInt(raw);
      setAlarm(atMs);
      return text(String(atMs));
    }
  }
  return text('not found\n', 404);
}

// GET /fetch?url=U: an outbound request with the standard fetch().
async function fetchRoute(queryString) {
  const url = queryParam(queryString, 'url');
  if (!url) return text('bad request: missing query parameter url\n', 400);
  try {
    const upstream = await fetch(url);
    const body = new Uint8Array(await upstream.arrayBuffer());
    return {
      status: upstream.status,
      headers: [['content-type', upstream.headers.get('content-type') || 'application/octet-stream']],
      body,
    };
  } catch (err) {
    return text(`outbound request failed: ${errorText(err)}`, 502);
  }
}

export const handler = {
  // An async export: componentize-js runs the event loop until the
  // returned promise settles, which fetch() needs.
  async handle(request) {
    const at = request.path.indexOf('?');
    const path = at < 0 ? request.path : request.path.slice(0, at);
    const queryString = at < 0 ? '' : request.path.slice(at + 1);
    if (request.method === 'GET' && path === '/fetch') return fetchRoute(queryString);
    try {
      return route(request.method, path, queryString);
    } catch (err) {
      return text(`${errorText(err)}\n`, 500);
    }
  },
};

export const events = {
  alarm(scheduledMs, retryCount) {
    try {
      increment(ALARMS);
    } catch (err) {
      // A thrown string is the `err` of result<_, string>: the host retries.
      throw errorText(err);
    }
  },

  socketMessage(id, message) {
    let reply = message;
    if (message.tag === 'text' && message.val === 'inc') {
      try {
        reply = { tag: 'text', val: String(increment(INCREMENTS)) };
      } catch (err) {
        reply = { tag: 'text', val: `error: ${errorText(err)}` };
      }
    }
    try {
      send(id, reply);
    } catch (err) {
      // The client may have gone meanwhile; its close event follows.
      log('debug', `reply not sent: ${errorText(err)}`);
    }
  },

  socketClose(id, code, reason) {},
};
