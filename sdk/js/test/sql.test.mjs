import assert from 'node:assert/strict';
import { test } from 'node:test';
import { SqlError, SqlValueError } from '../dist/errors.js';
import { Sql, fromSqlValue, rowsToObjects, toSqlValue, toSqlValues } from '../dist/sql.js';

const int = (n) => ({ tag: 'integer', val: BigInt(n) });

test('parameters convert to SQLite values', () => {
  assert.deepEqual(toSqlValue(3), int(3));
  assert.deepEqual(toSqlValue(-7), int(-7));
  assert.deepEqual(toSqlValue(2.5), { tag: 'real', val: 2.5 });
  assert.deepEqual(toSqlValue(-0), { tag: 'real', val: -0 });
  assert.deepEqual(toSqlValue(2 ** 60), { tag: 'real', val: 2 ** 60 });
  assert.deepEqual(toSqlValue(Infinity), { tag: 'real', val: Infinity });
  assert.deepEqual(toSqlValue(2n ** 62n), { tag: 'integer', val: 2n ** 62n });
  assert.deepEqual(toSqlValue(true), int(1));
  assert.deepEqual(toSqlValue(false), int(0));
  assert.deepEqual(toSqlValue('hi'), { tag: 'text', val: 'hi' });
  assert.deepEqual(toSqlValue(null), { tag: 'null' });
  assert.deepEqual(toSqlValue(new Uint8Array([1, 2])), { tag: 'blob', val: new Uint8Array([1, 2]) });
  assert.deepEqual(toSqlValue(new Uint8Array([9, 1, 2]).buffer), { tag: 'blob', val: new Uint8Array([9, 1, 2]) });
  const view = new DataView(new Uint8Array([0, 5, 6, 0]).buffer, 1, 2);
  assert.deepEqual(toSqlValue(view), { tag: 'blob', val: new Uint8Array([5, 6]) });
  assert.deepEqual(toSqlValue({ tag: 'real', val: 2 }), { tag: 'real', val: 2 });
});

test('parameters that are not SQL values are clear errors naming the parameter', () => {
  assert.throws(() => toSqlValues([1, undefined]), { name: 'SqlValueError', message: 'sql: parameter 2 is undefined (pass null for NULL)' });
  assert.throws(() => toSqlValues([NaN]), /parameter 1 is NaN/);
  assert.throws(() => toSqlValue(2n ** 63n), /does not fit a signed 64-bit INTEGER/);
  assert.throws(() => toSqlValue(-(2n ** 63n) - 1n), SqlValueError);
  assert.throws(() => toSqlValue(new Date()), /Date is not a SQL value/);
  assert.throws(() => toSqlValue({ a: 1 }), /Object is not a SQL value/);
  assert.throws(() => toSqlValue({ tag: 'integer', val: 1 }), /holds number/);
  assert.throws(() => toSqlValue(Symbol('s')), /symbol is not a SQL value/);
});

test('columns convert back; INTEGER as number must be exact', () => {
  assert.equal(fromSqlValue(int(5), 'n', 'number'), 5);
  assert.equal(fromSqlValue(int(5), 'n', 'bigint'), 5n);
  assert.equal(fromSqlValue({ tag: 'real', val: 1.5 }, 'x', 'number'), 1.5);
  assert.equal(fromSqlValue({ tag: 'null' }, 'x', 'number'), null);
  assert.deepEqual(fromSqlValue({ tag: 'blob', val: new Uint8Array([1]) }, 'b', 'number'), new Uint8Array([1]));
  assert.equal(fromSqlValue(int(2 ** 53 - 1), 'n', 'number'), 2 ** 53 - 1);
  assert.throws(() => fromSqlValue({ tag: 'integer', val: 2n ** 53n }, 'big', 'number'), {
    name: 'SqlValueError',
    message: 'sql: column big: INTEGER 9007199254740992 is not exact as a number (past 2^53); read it with sql.bigint',
  });
});

test('rows become objects; a repeated column name is an error', () => {
  const rows = { columns: ['id', 'name', 'score'], rows: [[int(1), { tag: 'text', val: 'a' }, { tag: 'real', val: 0.5 }]] };
  assert.deepEqual(rowsToObjects(rows, 'number'), [{ id: 1, name: 'a', score: 0.5 }]);
  assert.deepEqual(rowsToObjects(rows, 'bigint'), [{ id: 1n, name: 'a', score: 0.5 }]);
  assert.throws(() => rowsToObjects({ columns: ['id', 'id'], rows: [] }, 'number'), /"id" appears twice: give one an alias with AS/);
  assert.throws(() => rowsToObjects({ columns: ['a'], rows: [[]] }, 'number'), /a row has 0 values for 1 columns/);
});

/** A fake sql host: records statements, answers from a script. */
function fakeHost(answer = () => ({ columns: [], rows: [] })) {
  const calls = [];
  return {
    calls,
    execute(statement, params) {
      calls.push(['execute', statement, params]);
      const a = answer(statement, params);
      if (a instanceof Error) throw a;
      return typeof a === 'bigint' ? a : 0n;
    },
    query(statement, params) {
      calls.push(['query', statement, params]);
      const a = answer(statement, params);
      if (a instanceof Error) throw a;
      return a;
    },
  };
}

const hostError = (payload) => Object.assign(new Error('ComponentError'), { payload });

test('execute converts parameters and returns the rows changed as a number', () => {
  const host = fakeHost(() => 3n);
  const sql = new Sql(host);
  assert.equal(sql.execute('UPDATE t SET a = ? WHERE b = ?', 'x', 7), 3);
  assert.deepEqual(host.calls, [['execute', 'UPDATE t SET a = ? WHERE b = ?', [{ tag: 'text', val: 'x' }, int(7)]]]);
  assert.deepEqual(new Sql(fakeHost()).real(2), { tag: 'real', val: 2 });
  assert.deepEqual(new Sql(fakeHost()).integer(2n ** 40n), int(2n ** 40n));
  assert.throws(() => new Sql(fakeHost()).integer(0.5), /not a safe integer/);
});

test("the host's errors are SqlErrors with the statement", () => {
  const sql = new Sql(fakeHost(() => hostError('no such table: counter')));
  assert.throws(
    () => sql.query('SELECT n FROM counter'),
    (err) => err instanceof SqlError && err.isMissingTable && err.statement === 'SELECT n FROM counter' && err.message === 'sql: no such table: counter',
  );
  const other = new Sql(fakeHost(() => hostError('syntax error')));
  assert.throws(() => other.execute('x'), (err) => err instanceof SqlError && !err.isMissingTable);
});

test('query, first, value and bigint read rows', () => {
  const rows = {
    columns: ['id', 'title'],
    rows: [
      [int(1), { tag: 'text', val: 'one' }],
      [int(2), { tag: 'text', val: 'two' }],
    ],
  };
  const sql = new Sql(fakeHost(() => rows));
  assert.deepEqual(sql.query('SELECT id, title FROM t'), [{ id: 1, title: 'one' }, { id: 2, title: 'two' }]);
  assert.deepEqual(sql.first('SELECT id, title FROM t'), { id: 1, title: 'one' });
  assert.equal(sql.value('SELECT id FROM t'), 1);
  assert.equal(sql.bigint.value('SELECT id FROM t'), 1n);
  assert.deepEqual(sql.bigint.first('SELECT id, title FROM t'), { id: 1n, title: 'one' });
  assert.deepEqual(sql.raw('SELECT id, title FROM t'), rows);
  const empty = new Sql(fakeHost());
  assert.equal(empty.first('SELECT 1 WHERE 0'), undefined);
  assert.equal(empty.value('SELECT 1 WHERE 0'), undefined);
});

test('a transaction is a savepoint, released on return', () => {
  const host = fakeHost();
  const sql = new Sql(host);
  const result = sql.transaction(() => {
    sql.execute('INSERT INTO t VALUES (1)');
    return 'done';
  });
  assert.equal(result, 'done');
  assert.deepEqual(
    host.calls.map((c) => c[1]),
    ['SAVEPOINT wasmkeep_tx_1', 'INSERT INTO t VALUES (1)', 'RELEASE wasmkeep_tx_1'],
  );
});

test('a transaction that throws is rolled back and the error rethrown; they nest', () => {
  const host = fakeHost();
  const sql = new Sql(host);
  assert.throws(
    () =>
      sql.transaction(() => {
        sql.execute('INSERT 1');
        sql.bigint.transaction(() => sql.execute('INSERT 2'));
        throw new Error('changed my mind');
      }),
    /changed my mind/,
  );
  assert.deepEqual(host.calls.map((c) => c[1]), [
    'SAVEPOINT wasmkeep_tx_1',
    'INSERT 1',
    'SAVEPOINT wasmkeep_tx_2',
    'INSERT 2',
    'RELEASE wasmkeep_tx_2',
    'ROLLBACK TO wasmkeep_tx_1',
    'RELEASE wasmkeep_tx_1',
  ]);
  // The depth is back to 0: the next transaction is tx_1 again.
  host.calls.length = 0;
  sql.transaction(() => {});
  assert.equal(host.calls[0][1], 'SAVEPOINT wasmkeep_tx_1');
});

test('an async transaction ends when its promise settles', async () => {
  const host = fakeHost();
  const sql = new Sql(host);
  const value = await sql.transaction(async () => {
    await null;
    sql.execute('INSERT 1');
    return 7;
  });
  assert.equal(value, 7);
  await assert.rejects(
    sql.transaction(async () => {
      throw new Error('no');
    }),
    /no/,
  );
  assert.deepEqual(host.calls.map((c) => c[1]), [
    'SAVEPOINT wasmkeep_tx_1',
    'INSERT 1',
    'RELEASE wasmkeep_tx_1',
    'SAVEPOINT wasmkeep_tx_1',
    'ROLLBACK TO wasmkeep_tx_1',
    'RELEASE wasmkeep_tx_1',
  ]);
});
