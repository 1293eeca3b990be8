//! The actor's own SQLite database: statements with `?` parameters built by
//! [`params!`](crate::params), and rows read into Rust tuples.
//!
//! Every write of one event commits together when the event returns; there is
//! no `BEGIN`/`COMMIT` to write. Tables whose names start with `_wasmkeep` are
//! the host's and refused.

use crate::bindings::wasmkeep::actor::sql as wit;
use crate::error::{Error, Result};

pub use wit::{Rows, Value};

/// Builds a statement's parameter list: `params![1, "text", None::<i64>]`.
/// Each argument is anything that implements [`ToSql`].
#[macro_export]
macro_rules! params {
    ($($value:expr),* $(,)?) => {{
        let params: ::std::vec::Vec<$crate::sql::Value> =
            ::std::vec![$($crate::sql::ToSql::to_sql(&$value)),*];
        params
    }};
}
pub use crate::params;

/// Runs one statement; returns the number of rows it changed.
pub fn execute(statement: &str, params: impl AsRef<[Value]>) -> Result<u64> {
    wit::execute(statement, params.as_ref()).map_err(Error::Sql)
}

/// Runs one statement and returns its columns and every row, untyped.
pub fn query(statement: &str, params: impl AsRef<[Value]>) -> Result<Rows> {
    wit::query(statement, params.as_ref()).map_err(Error::Sql)
}

/// Runs one statement and converts every row to `T` (a tuple, or `Vec<Value>`).
pub fn query_as<T: FromRow>(statement: &str, params: impl AsRef<[Value]>) -> Result<Vec<T>> {
    query(statement, params)?
        .rows
        .into_iter()
        .map(T::from_row)
        .collect()
}

/// The first row as `T`; [`Error::NoRows`] when there is none.
pub fn query_row<T: FromRow>(statement: &str, params: impl AsRef<[Value]>) -> Result<T> {
    query_opt(statement, params)?.ok_or(Error::NoRows)
}

/// The first row as `T`, or `None` when there is none.
pub fn query_opt<T: FromRow>(statement: &str, params: impl AsRef<[Value]>) -> Result<Option<T>> {
    match query(statement, params)?.rows.into_iter().next() {
        Some(row) => T::from_row(row).map(Some),
        None => Ok(None),
    }
}

/// The first column of the first row as `T`, or `None` when there is no row:
/// `sql::query_value::<i64>("SELECT n FROM counter WHERE id = 1", params![])`.
pub fn query_value<T: FromValue>(
    statement: &str,
    params: impl AsRef<[Value]>,
) -> Result<Option<T>> {
    query_opt::<(T,)>(statement, params).map(|row| row.map(|(value,)| value))
}

/// A Rust value that can be a statement parameter.
pub trait ToSql {
    fn to_sql(&self) -> Value;
}

impl ToSql for Value {
    fn to_sql(&self) -> Value {
        self.clone()
    }
}

impl<T: ToSql + ?Sized> ToSql for &T {
    fn to_sql(&self) -> Value {
        (**self).to_sql()
    }
}

impl<T: ToSql> ToSql for Option<T> {
    fn to_sql(&self) -> Value {
        self.as_ref().map_or(Value::Null, ToSql::to_sql)
    }
}

macro_rules! to_sql_integer {
    ($($ty:ty),*) => {$(
        impl ToSql for $ty {
            fn to_sql(&self) -> Value {
                Value::Integer(i64::from(*self))
            }
        }
    )*};
}
to_sql_integer!(i8, i16, i32, i64, u8, u16, u32, bool);

impl ToSql for f64 {
    fn to_sql(&self) -> Value {
        Value::Real(*self)
    }
}

impl ToSql for f32 {
    fn to_sql(&self) -> Value {
        Value::Real(f64::from(*self))
    }
}

impl ToSql for str {
    fn to_sql(&self) -> Value {
        Value::Text(self.to_owned())
    }
}

impl ToSql for String {
    fn to_sql(&self) -> Value {
        Value::Text(self.clone())
    }
}

impl ToSql for [u8] {
    fn to_sql(&self) -> Value {
        Value::Blob(self.to_vec())
    }
}

impl ToSql for Vec<u8> {
    fn to_sql(&self) -> Value {
        Value::Blob(self.clone())
    }
}

/// Why one value did not convert (the row conversion adds the column index).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mismatch {
    pub expected: &'static str,
    pub found: &'static str,
}

/// The SQLite storage class of a value, for error messages.
pub fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "NULL",
        Value::Integer(_) => "INTEGER",
        Value::Real(_) => "REAL",
        Value::Text(_) => "TEXT",
        Value::Blob(_) => "BLOB",
    }
}

/// A Rust type one column converts to.
pub trait FromValue: Sized {
    fn from_value(value: Value) -> std::result::Result<Self, Mismatch>;
}

fn mismatch<T>(expected: &'static str, value: &Value) -> std::result::Result<T, Mismatch> {
    Err(Mismatch {
        expected,
        found: type_name(value),
    })
}

impl FromValue for Value {
    fn from_value(value: Value) -> std::result::Result<Self, Mismatch> {
        Ok(value)
    }
}

impl FromValue for i64 {
    fn from_value(value: Value) -> std::result::Result<Self, Mismatch> {
        match value {
            Value::Integer(n) => Ok(n),
            other => mismatch("INTEGER", &other),
        }
    }
}

macro_rules! from_value_integer {
    ($($ty:ty),*) => {$(
        impl FromValue for $ty {
            fn from_value(value: Value) -> std::result::Result<Self, Mismatch> {
                match value {
                    Value::Integer(n) => <$ty>::try_from(n).map_err(|_| Mismatch {
                        expected: concat!("INTEGER in the range of ", stringify!($ty)),
                        found: "INTEGER out of range",
                    }),
                    other => mismatch("INTEGER", &other),
                }
            }
        }
    )*};
}
from_value_integer!(i8, i16, i32, u8, u16, u32, u64, usize);

impl FromValue for bool {
    fn from_value(value: Value) -> std::result::Result<Self, Mismatch> {
        match value {
            Value::Integer(n) => Ok(n != 0),
            other => mismatch("INTEGER (bool)", &other),
        }
    }
}

impl FromValue for f64 {
    /// SQLite stores whole REAL numbers as INTEGER when it may; both convert.
    fn from_value(value: Value) -> std::result::Result<Self, Mismatch> {
        match value {
            Value::Real(x) => Ok(x),
            #[allow(clippy::cast_precision_loss)] // SQLite's own INTEGER to REAL conversion
            Value::Integer(n) => Ok(n as f64),
            other => mismatch("REAL", &other),
        }
    }
}

impl FromValue for String {
    fn from_value(value: Value) -> std::result::Result<Self, Mismatch> {
        match value {
            Value::Text(text) => Ok(text),
            other => mismatch("TEXT", &other),
        }
    }
}

impl FromValue for Vec<u8> {
    fn from_value(value: Value) -> std::result::Result<Self, Mismatch> {
        match value {
            Value::Blob(bytes) => Ok(bytes),
            Value::Text(text) => Ok(text.into_bytes()),
            other => mismatch("BLOB", &other),
        }
    }
}

impl<T: FromValue> FromValue for Option<T> {
    fn from_value(value: Value) -> std::result::Result<Self, Mismatch> {
        match value {
            Value::Null => Ok(None),
            other => T::from_value(other).map(Some),
        }
    }
}

/// A Rust type one row converts to: tuples of [`FromValue`] types (the arity
/// must equal the number of columns), or `Vec<Value>` for any row.
pub trait FromRow: Sized {
    fn from_row(row: Vec<Value>) -> Result<Self>;
}

impl FromRow for Vec<Value> {
    fn from_row(row: Vec<Value>) -> Result<Self> {
        Ok(row)
    }
}

macro_rules! from_row_tuple {
    ($n:literal: $($ty:ident),+) => {
        impl<$($ty: FromValue),+> FromRow for ($($ty,)+) {
            fn from_row(row: Vec<Value>) -> Result<Self> {
                if row.len() != $n {
                    return Err(Error::ColumnCount { expected: $n, found: row.len() });
                }
                let mut values = row.into_iter().enumerate();
                Ok(($({
                    let (column, value) = values.next().expect("length checked above");
                    $ty::from_value(value).map_err(|m| Error::ColumnType {
                        column,
                        expected: m.expected,
                        found: m.found,
                    })?
                },)+))
            }
        }
    };
}
from_row_tuple!(1: A);
from_row_tuple!(2: A, B);
from_row_tuple!(3: A, B, C);
from_row_tuple!(4: A, B, C, D);
from_row_tuple!(5: A, B, C, D, E);
from_row_tuple!(6: A, B, C, D, E, F);
from_row_tuple!(7: A, B, C, D, E, F, G);
from_row_tuple!(8: A, B, C, D, E, F, G, H);

#[cfg(test)]
mod tests {
    use super::*;

    fn row() -> Vec<Value> {
        vec![
            Value::Integer(3),
            Value::Text("hi".into()),
            Value::Null,
            Value::Integer(1),
            Value::Blob(vec![1, 2]),
            Value::Integer(2),
        ]
    }

    #[test]
    fn rows_convert_to_tuples() {
        let (n, text, missing, flag, blob, real) =
            <(i64, String, Option<i64>, bool, Vec<u8>, f64)>::from_row(row()).unwrap();
        assert_eq!(
            (n, text.as_str(), missing, flag, blob, real),
            (3, "hi", None, true, vec![1, 2], 2.0)
        );
    }

    #[test]
    fn wrong_arity_is_an_error() {
        let err = <(i64,)>::from_row(row()).unwrap_err();
        assert_eq!(
            err,
            Error::ColumnCount {
                expected: 1,
                found: 6
            }
        );
    }

    #[test]
    fn wrong_type_names_the_column() {
        let err =
            <(i64, i64)>::from_row(vec![Value::Integer(1), Value::Text("x".into())]).unwrap_err();
        assert_eq!(
            err,
            Error::ColumnType {
                column: 1,
                expected: "INTEGER",
                found: "TEXT"
            }
        );
    }

    #[test]
    fn out_of_range_integer_is_an_error_not_a_wrap() {
        assert!(u8::from_value(Value::Integer(300)).is_err());
        assert!(u64::from_value(Value::Integer(-1)).is_err());
    }

    #[test]
    fn params_macro_converts_each_argument() {
        let name = String::from("bob");
        let params = params![1, "a", &name, None::<i64>, 2.5, true, vec![7u8]];
        assert!(matches!(params[0], Value::Integer(1)));
        assert!(matches!(&params[2], Value::Text(t) if t == "bob"));
        assert!(matches!(params[3], Value::Null));
        assert!(matches!(params[5], Value::Integer(1)));
        assert!(params![].is_empty());
    }

    #[test]
    fn missing_table_is_recognised() {
        assert!(Error::Sql("no such table: counter".into()).is_missing_table());
        assert!(!Error::Sql("syntax error".into()).is_missing_table());
    }
}
