//! Sans-IO codecs of what other tools speak: bytes in, validated batches or parsed queries
//! out, and answers back in the shapes those tools expect.
//!
//! Owns the mapping of foreign names to series keys ([`names`]), InfluxDB line protocol
//! ([`line_protocol`]), Prometheus remote write ([`remote_write`]) and remote read
//! ([`remote_read`], with the XOR chunks of [`chunkenc`]), bounded decompression of
//! request bodies ([`compression`]), the Prometheus text exposition format ([`exposition`]),
//! the InfluxQL subset with its answers ([`influxql`]), PromQL with Prometheus' query API
//! ([`promql`]), points in CSV rows ([`csv_points`], for `timeshard put` and `import`), raw
//! reads written out as they stream ([`columns`], JSON columns and CSV rows) and
//! times as people type them ([`timestamps`]). The node's HTTP server
//! (`timeshard_node::http`) runs them against the coordinator.

pub mod chunkenc;
pub mod columns;
pub mod compression;
pub mod csv_points;
pub mod exposition;
pub mod influxql;
pub mod line_protocol;
pub mod long_lines;
pub mod names;
pub mod promql;
pub mod remote_read;
pub mod remote_write;
pub mod timestamps;
