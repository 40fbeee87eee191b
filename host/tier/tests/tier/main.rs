//! The cold tier's own integration tests, one binary: the archive on in-memory and
//! fault-injecting object stores, with no outside server. (S3 on moto's server and DuckDB
//! reading the archive need outside programs: they are end-to-end tests, in `tests/`.)

mod catalog;
mod export;
mod faults;
mod model;
mod retention;
mod sim;
mod support;
mod trust;
