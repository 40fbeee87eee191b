//! The generated wasmtime bindings of the WIT package in `wit/`: the only place that calls
//! `bindgen!`. The query world reuses the ingest world's `types` and `host` modules, so both
//! worlds share one set of Rust types.

mod ingest_world {
    wasmtime::component::bindgen!({
        path: "../../wit",
        world: "ingest-policy",
    });
}

mod query_world {
    wasmtime::component::bindgen!({
        path: "../../wit",
        world: "query-policy",
        with: {
            "timeshard:policy/types": super::ingest_world::timeshard::policy::types,
            "timeshard:policy/host": super::ingest_world::timeshard::policy::host,
        },
    });
}

pub(crate) use ingest_world::IngestPolicyPre;
pub(crate) use ingest_world::timeshard::policy::host;
pub(crate) use ingest_world::timeshard::policy::types;
pub(crate) use query_world::QueryPolicyPre;
