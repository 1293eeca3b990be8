// The counter actor in TypeScript with @wasmkeep/sdk: the same HTTP and
// WebSocket contract as examples/counter (Rust), against the same WIT
// (wit/actor.wit), built into a component by `npm run build` (wasmkeep-build:
// esbuild, then componentize-js; see build.sh).
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

import { Response, Router, SqlError, alarm, defineActor, errorText, log, sockets, sql } from '@wasmkeep/sdk';

// The row of the request count and the row of the alarm count.
const INCREMENTS = 1;
const ALARMS = 2;
// The furthest ahead an alarm may be set: a year.
const ALARM_DELAY_MS_MAX = 366 * 24 * 3600 * 1000;

const CREATE = 'CREATE TABLE IF NOT EXISTS counter(id INTEGER PRIMARY KEY, n INTEGER NOT NULL)';
const INCREMENT =
  'INSERT INTO counter(id, n) VALUES (?, 1) ON CONFLICT(id) DO UPDATE SET n = n + 1 RETURNING n';
const VALUE = 'SELECT n FROM counter WHERE id = ?';

const HELP = `counter actor (TypeScript)
  POST /increment        add one; returns the new count
  GET  /value            the count
  POST /alarm?in_ms=N    set the alarm N ms ahead; returns its time (ms since the epoch)
  GET  /alarms           how many times the alarm has fired
  GET  /fetch?url=U      fetch() U; its status and body
  WebSocket /ws          send "inc", receive the new count
`;

const missingTable = (err: unknown) => err instanceof SqlError && err.isMissingTable;

// Adds one to row `id` and returns its new value: one statement, plus the
// table's creation when that statement finds it missing.
function increment(id: number): number {
  try {
    return sql.value<number>(INCREMENT, id)!;
  } catch (err) {
    if (!missingTable(err)) throw err;
    sql.execute(CREATE);
    return sql.value<number>(INCREMENT, id)!;
  }
}

// The value of row `id`; 0 before its first increment.
function value(id: number): number {
  try {
    return sql.value<number>(VALUE, id) ?? 0;
  } catch (err) {
    if (missingTable(err)) return 0;
    throw err;
  }
}

const router = new Router()
  .get('/', () => HELP)
  .post('/increment', () => String(increment(INCREMENTS)))
  .get('/value', () => String(value(INCREMENTS)))
  .get('/alarms', () => String(value(ALARMS)))
  .post('/alarm', (request) => {
    const raw = request.queryParam('in_ms');
    if (raw === undefined) return Response.badRequest('missing query parameter in_ms');
    if (!/^[0-9]+$/.test(raw) || Number(raw) > ALARM_DELAY_MS_MAX) {
      return Response.badRequest(`in_ms=${JSON.stringify(raw)} is not 0..=${ALARM_DELAY_MS_MAX}`);
    }
    return String(alarm.setIn(Number(raw)));
  })
  // An async handler: componentize-js runs the event loop until the
  // returned promise settles, which fetch() needs.
  .get('/fetch', async (request) => {
    const url = request.queryParam('url');
    if (!url) return Response.badRequest('missing query parameter url');
    try {
      const upstream = await fetch(url);
      const body = new Uint8Array(await upstream.arrayBuffer());
      return Response.bytes(body, upstream.headers.get('content-type') || 'application/octet-stream', upstream.status);
    } catch (err) {
      return Response.text(`outbound request failed: ${errorText(err)}`, 502);
    }
  });

export default defineActor({
  fetch: router,

  // A throw here asks the host to retry the alarm.
  alarm() {
    increment(ALARMS);
  },

  message(socket, message) {
    let reply = message;
    if (message === 'inc') {
      try {
        reply = String(increment(INCREMENTS));
      } catch (err) {
        reply = `error: ${errorText(err)}`;
      }
    }
    try {
      sockets.send(socket, reply);
    } catch (err) {
      // The client may have gone meanwhile; its close event follows.
      log.debug(`reply not sent: ${errorText(err)}`);
    }
  },
});
