// {{name}}: a wasmkeep actor, a counter to start from. Each actor
// (`TENANT/{{name}}/NAME`) has its own SQLite database.
//
//   POST /increment   adds one and answers the new count
//   GET  /value       answers the count (0 before the first increment)

import { Router, SqlError, defineActor, sql } from '@wasmkeep/sdk';

function increment(): number {
  sql.execute('CREATE TABLE IF NOT EXISTS counter(id INTEGER PRIMARY KEY, n INTEGER NOT NULL)');
  return sql.value<number>(
    'INSERT INTO counter(id, n) VALUES (1, 1) ON CONFLICT(id) DO UPDATE SET n = n + 1 RETURNING n',
  )!;
}

function value(): number {
  try {
    return sql.value<number>('SELECT n FROM counter WHERE id = 1') ?? 0;
  } catch (err) {
    if (err instanceof SqlError && err.isMissingTable) return 0;
    throw err;
  }
}

const router = new Router()
  .post('/increment', () => String(increment()))
  .get('/value', () => String(value()));

export default defineActor({ fetch: router });
