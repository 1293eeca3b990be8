// The actor's own SQLite database: statements with `?` parameters, rows as
// objects (column name -> value), and savepoint transactions.
//
// Every write of one event commits together when the event returns; there is
// no BEGIN/COMMIT (the host refuses them). `transaction(fn)` is a SAVEPOINT
// inside the event's transaction: it undoes its own writes when fn throws.

import { SqlError, SqlValueError, errorText } from './errors.js';
import { describe, isArrayBuffer, isBytes, isPromise } from './util.js';
import type { SqlHost, WitRows, WitValue } from './wit-types.js';

/** An explicit SQLite value: the WIT variant (`sql.real(2)` makes one). */
export type SqlValue = WitValue;

/**
 * What a parameter may be:
 * - `null` is NULL (`undefined` is refused: it is usually a bug);
 * - a `number` that is a safe integer is INTEGER, any other number REAL
 *   (NaN is refused); use `sql.real(2)` for a whole REAL;
 * - a `bigint` is INTEGER (within the signed 64-bit range);
 * - a `boolean` is INTEGER 1 or 0;
 * - a `string` is TEXT;
 * - a `Uint8Array` (or any ArrayBuffer view, or an ArrayBuffer) is BLOB;
 * - a `SqlValue` (`{ tag, val }`) is itself.
 */
export type SqlParam = null | number | bigint | boolean | string | Uint8Array | ArrayBufferView | ArrayBuffer | SqlValue;

/** A column's value: INTEGER as `I` (number by default), REAL a number, TEXT a string, BLOB a Uint8Array. */
export type SqlOutput<I = number> = null | I | number | string | Uint8Array;

/** A row: column name -> value. */
export type Row<I = number> = Record<string, SqlOutput<I>>;

/** How INTEGER columns arrive: `number` (checked to be exact) or `bigint`. */
export type IntegerMode = 'number' | 'bigint';

const S64_MIN = -(2n ** 63n);
const S64_MAX = 2n ** 63n - 1n;
const VALUE_TAGS = new Set(['null', 'integer', 'real', 'text', 'blob']);

function integerValue(n: bigint, where: string): WitValue {
  if (n < S64_MIN || n > S64_MAX) throw new SqlValueError(`${where}: ${n} does not fit a signed 64-bit INTEGER`);
  return { tag: 'integer', val: n };
}

/** Converts one parameter; `where` names it in errors (`parameter 2`). */
export function toSqlValue(value: SqlParam, where = 'parameter'): WitValue {
  switch (typeof value) {
    case 'number':
      if (Number.isNaN(value)) throw new SqlValueError(`${where} is NaN`);
      return Number.isSafeInteger(value) && !Object.is(value, -0)
        ? { tag: 'integer', val: BigInt(value) }
        : { tag: 'real', val: value };
    case 'bigint':
      return integerValue(value, where);
    case 'boolean':
      return { tag: 'integer', val: value ? 1n : 0n };
    case 'string':
      return { tag: 'text', val: value };
    case 'undefined':
      throw new SqlValueError(`${where} is undefined (pass null for NULL)`);
    case 'object':
      if (value === null) return { tag: 'null' };
      if (isBytes(value)) return { tag: 'blob', val: value };
      if (ArrayBuffer.isView(value)) {
        return { tag: 'blob', val: new Uint8Array(value.buffer, value.byteOffset, value.byteLength) };
      }
      if (isArrayBuffer(value)) return { tag: 'blob', val: new Uint8Array(value) };
      if ('tag' in value && VALUE_TAGS.has((value as { tag: string }).tag)) return checkValue(value as WitValue, where);
      break;
    default:
      break;
  }
  throw new SqlValueError(`${where}: ${describe(value)} is not a SQL value (null, number, bigint, boolean, string, Uint8Array)`);
}

function checkValue(value: WitValue, where: string): WitValue {
  const ok = (() => {
    switch (value.tag) {
      case 'null':
        return true;
      case 'integer':
        return typeof value.val === 'bigint' && value.val >= S64_MIN && value.val <= S64_MAX;
      case 'real':
        return typeof value.val === 'number';
      case 'text':
        return typeof value.val === 'string';
      case 'blob':
        return isBytes(value.val);
    }
  })();
  if (!ok) throw new SqlValueError(`${where}: { tag: '${value.tag}' } holds ${describe(value.val)}`);
  return value;
}

/** Converts every parameter of a statement. */
export function toSqlValues(params: readonly SqlParam[]): WitValue[] {
  return params.map((p, i) => toSqlValue(p, `parameter ${i + 1}`));
}

/** Converts one column value; INTEGER as a number must be a safe integer. */
export function fromSqlValue(value: WitValue, column: string, integers: 'number'): SqlOutput<number>;
export function fromSqlValue(value: WitValue, column: string, integers: 'bigint'): SqlOutput<bigint>;
export function fromSqlValue(value: WitValue, column: string, integers: IntegerMode): SqlOutput<number | bigint>;
export function fromSqlValue(value: WitValue, column: string, integers: IntegerMode): SqlOutput<number | bigint> {
  switch (value.tag) {
    case 'null':
      return null;
    case 'integer': {
      if (integers === 'bigint') return value.val;
      const n = Number(value.val);
      if (!Number.isSafeInteger(n)) {
        throw new SqlValueError(
          `column ${column}: INTEGER ${value.val} is not exact as a number (past 2^53); read it with sql.bigint`,
        );
      }
      return n;
    }
    case 'real':
    case 'text':
    case 'blob':
      return value.val;
  }
}

/** Turns the host's rows into objects keyed by column name. */
export function rowsToObjects(rows: WitRows, integers: IntegerMode): Row<number | bigint>[] {
  const seen = new Set<string>();
  for (const column of rows.columns) {
    if (seen.has(column)) {
      throw new SqlValueError(`column name ${JSON.stringify(column)} appears twice: give one an alias with AS`);
    }
    seen.add(column);
  }
  return rows.rows.map((row) => {
    if (row.length !== rows.columns.length) {
      throw new SqlValueError(`a row has ${row.length} values for ${rows.columns.length} columns`);
    }
    const object: Row<number | bigint> = {};
    rows.columns.forEach((column, i) => {
      object[column] = fromSqlValue(row[i]!, column, integers);
    });
    return object;
  });
}

/** Makes an explicit value: `sql.real(2)` is REAL 2.0, not INTEGER 2. */
export const values = {
  null: (): SqlValue => ({ tag: 'null' }),
  integer: (n: number | bigint): SqlValue => {
    if (typeof n === 'number' && !Number.isSafeInteger(n)) {
      throw new SqlValueError(`sql.integer(${n}): not a safe integer (use a bigint)`);
    }
    return integerValue(BigInt(n), `sql.integer(${n})`);
  },
  real: (x: number): SqlValue => ({ tag: 'real', val: x }),
  text: (s: string): SqlValue => ({ tag: 'text', val: s }),
  blob: (bytes: Uint8Array): SqlValue => ({ tag: 'blob', val: bytes }),
};

/** Transaction depth, shared by an Sql and its `bigint` twin. */
interface Shared {
  depth: number;
}

/**
 * SQL on the actor's database. `sql` reads INTEGER as `number` (an error
 * when one is past 2^53), `sql.bigint` reads INTEGER as `bigint`.
 */
export class Sql<I extends number | bigint = number> {
  private readonly host: SqlHost;
  private readonly integers: IntegerMode;
  private readonly shared: Shared;

  constructor(host: SqlHost, integers: IntegerMode = 'number', shared: Shared = { depth: 0 }) {
    this.host = host;
    this.integers = integers;
    this.shared = shared;
  }

  /** The same database with INTEGER columns read as `bigint`. */
  get bigint(): Sql<bigint> {
    return new Sql<bigint>(this.host, 'bigint', this.shared);
  }

  /** Explicit values: `sql.real(2)`, `sql.integer(2n ** 40n)`, `sql.blob(bytes)`. */
  readonly null = values.null;
  readonly integer = values.integer;
  readonly real = values.real;
  readonly text = values.text;
  readonly blob = values.blob;

  /**
   * Runs one statement that returns no rows; returns how many rows it
   * inserted, updated or deleted (0 for any other statement). A statement
   * that returns rows (SELECT, RETURNING) is refused: use `query`.
   */
  execute(statement: string, ...params: SqlParam[]): number {
    const wit = toSqlValues(params);
    let changed: bigint;
    try {
      changed = this.host.execute(statement, wit);
    } catch (err) {
      throw new SqlError(errorText(err), statement);
    }
    return Number(changed);
  }

  /**
   * Runs one statement and returns every row as an object, column name ->
   * value. `T` describes the row (it is not checked at run time).
   */
  query<T extends object = Row<I>>(statement: string, ...params: SqlParam[]): T[] {
    return rowsToObjects(this.raw(statement, ...params), this.integers) as unknown as T[];
  }

  /** The first row, or undefined when there is none. */
  first<T extends object = Row<I>>(statement: string, ...params: SqlParam[]): T | undefined {
    return this.query<T>(statement, ...params)[0];
  }

  /**
   * The first column of the first row, or undefined when there is no row
   * (a NULL is null): `sql.value<number>('SELECT count(*) FROM t')`.
   */
  value<T extends SqlOutput<I> = SqlOutput<I>>(statement: string, ...params: SqlParam[]): T | undefined {
    const rows = this.raw(statement, ...params);
    const first = rows.rows[0];
    if (first === undefined) return undefined;
    if (first.length === 0) throw new SqlValueError('the statement returned no columns');
    return fromSqlValue(first[0]!, rows.columns[0] ?? '0', this.integers) as T;
  }

  /** The host's answer unchanged: column names, and rows of `SqlValue`s. */
  raw(statement: string, ...params: SqlParam[]): WitRows {
    const wit = toSqlValues(params);
    try {
      return this.host.query(statement, wit);
    } catch (err) {
      throw new SqlError(errorText(err), statement);
    }
  }

  /**
   * Runs `fn` in a SAVEPOINT: its writes stay when it returns (they commit
   * with the event) and are undone when it throws (the error is rethrown).
   * Nests. When `fn` returns a promise the savepoint is released or rolled
   * back once it settles; events never overlap, so nothing else writes
   * meanwhile.
   */
  transaction<R>(fn: () => R): R {
    const name = `wasmkeep_tx_${++this.shared.depth}`;
    const end = () => {
      this.shared.depth--;
    };
    try {
      this.execute(`SAVEPOINT ${name}`);
    } catch (err) {
      end();
      throw err;
    }
    const release = () => {
      try {
        this.execute(`RELEASE ${name}`);
      } finally {
        end();
      }
    };
    const rollback = () => {
      try {
        this.execute(`ROLLBACK TO ${name}`);
        this.execute(`RELEASE ${name}`);
      } finally {
        end();
      }
    };
    let result: R;
    try {
      result = fn();
    } catch (err) {
      rollback();
      throw err;
    }
    if (isPromise(result)) {
      return result.then(
        (value) => {
          release();
          return value;
        },
        (err: unknown) => {
          rollback();
          throw err;
        },
      ) as R;
    }
    release();
    return result;
  }
}
