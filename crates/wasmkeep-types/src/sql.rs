//! The values of an actor's SQL as they cross from the guest to its store:
//! the runtime hands them over from the guest world, the store binds and
//! reads them. One definition, so no layer converts them.

/// One SQL parameter or column value.
#[derive(Debug, Clone, PartialEq)]
pub enum SqlValue {
    Null,
    Integer(i64),
    Real(f64),
    Text(String),
    Blob(Vec<u8>),
}

/// The result of a query: column names, then each row's values in that order.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SqlRows {
    pub columns: Vec<String>,
    pub rows: Vec<Vec<SqlValue>>,
}
