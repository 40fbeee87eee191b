//! What a policy component must look like, checked without running or compiling it: a valid
//! WebAssembly component built against this host's WIT package (`timeshard:policy@0.1.0`),
//! exporting the interface of its kind with that interface's functions, and importing nothing
//! but the host interface. The control plane checks uploads with [`inspect`] (it has no
//! WebAssembly engine); a node checks again, fully, when it compiles and type-checks the
//! component (`engine`), so the two can only disagree by the node refusing more.

use wasmparser::component_types::ComponentEntityType;
use wasmparser::{Encoding, Parser, Payload, Validator, WasmFeatures};

use crate::Kind;

/// The WIT package (and version) policies are built against.
pub const PACKAGE: &str = "timeshard:policy@0.1.0";

/// The imports a policy component may have: the WIT package's `host` interface (and `types`,
/// which holds only types).
pub const ALLOWED_IMPORTS: &[&str] = &["timeshard:policy/host@0.1.0", "timeshard:policy/types@0.1.0"];
pub(crate) const ALLOWED_IMPORTS_TEXT: &str = "timeshard:policy/host@0.1.0 (logging)";

/// The interface a policy of `kind` exports.
pub fn export_name(kind: Kind) -> &'static str {
    match kind {
        Kind::Ingest => "timeshard:policy/ingest@0.1.0",
        Kind::Query => "timeshard:policy/query@0.1.0",
    }
}

/// The functions that interface holds.
fn functions(kind: Kind) -> &'static [&'static str] {
    match kind {
        Kind::Ingest => &["process"],
        Kind::Query => &["summarize", "merge"],
    }
}

/// Why bytes are not a policy component of a kind.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ComponentError {
    #[error(
        "it is a core WebAssembly module, not a component: build the guest for wasm32-wasip2 with \
         wit-bindgen (see guest/README.md)"
    )]
    CoreModule,
    #[error("it is not a valid WebAssembly component: {0}")]
    Invalid(String),
    #[error(
        "it imports `{import}`, which policies may not use: the host grants only {ALLOWED_IMPORTS_TEXT}; build \
         the guest without std and WASI (see guest/support)"
    )]
    ForbiddenImport { import: String },
    #[error("it is not an {kind} policy of {PACKAGE}: it does not export `{expected}` (it exports: {found})")]
    WrongWorld { kind: Kind, expected: &'static str, found: String },
    #[error("its export `{export}` has no function `{function}`, which the {kind} world requires")]
    MissingFunction { kind: Kind, export: &'static str, function: &'static str },
}

/// Checks that `bytes` are a policy component of `kind` for this host: valid, of the right
/// world and package version, with only the allowed imports.
pub fn inspect(bytes: &[u8], kind: Kind) -> Result<(), ComponentError> {
    // The top level's encoding first: a core module gets its own explanation.
    match Parser::new(0).parse_all(bytes).next() {
        Some(Ok(Payload::Version { encoding: Encoding::Module, .. })) => return Err(ComponentError::CoreModule),
        Some(Ok(Payload::Version { encoding: Encoding::Component, .. })) => {}
        Some(Err(e)) => return Err(ComponentError::Invalid(e.message().to_string())),
        _ => return Err(ComponentError::Invalid("it does not start with a WebAssembly header".into())),
    }
    let types = Validator::new_with_features(WasmFeatures::default())
        .validate_all(bytes)
        .map_err(|e| ComponentError::Invalid(e.message().to_string()))?;

    // Top-level imports and exports: nested modules and components begin with their own
    // `Version` payload and close with an `End`.
    let (mut imports, mut exports) = (Vec::new(), Vec::new());
    let mut depth = 0usize;
    for payload in Parser::new(0).parse_all(bytes) {
        match payload.map_err(|e| ComponentError::Invalid(e.message().to_string()))? {
            Payload::Version { .. } => depth += 1,
            Payload::End(_) => depth = depth.saturating_sub(1),
            Payload::ComponentImportSection(reader) if depth == 1 => {
                for import in reader {
                    let import = import.map_err(|e| ComponentError::Invalid(e.message().to_string()))?;
                    imports.push(import.name.name.to_string());
                }
            }
            Payload::ComponentExportSection(reader) if depth == 1 => {
                for export in reader {
                    let export = export.map_err(|e| ComponentError::Invalid(e.message().to_string()))?;
                    exports.push(export.name.name.to_string());
                }
            }
            _ => {}
        }
    }
    if let Some(import) = imports.iter().find(|i| !ALLOWED_IMPORTS.contains(&i.as_str())) {
        return Err(ComponentError::ForbiddenImport { import: import.clone() });
    }
    let expected = export_name(kind);
    if !exports.iter().any(|e| e == expected) {
        let found = if exports.is_empty() { "nothing".to_string() } else { exports.join(", ") };
        return Err(ComponentError::WrongWorld { kind, expected, found });
    }
    let item = types.component_item_for_export(expected).map(|i| &i.ty);
    let Some(ComponentEntityType::Instance(instance)) = item else {
        return Err(ComponentError::WrongWorld { kind, expected, found: format!("{expected} as something else") });
    };
    let instance = &types[*instance];
    for &function in functions(kind) {
        if !matches!(instance.exports.get(function).map(|i| &i.ty), Some(ComponentEntityType::Func(_))) {
            return Err(ComponentError::MissingFunction { kind, export: expected, function });
        }
    }
    Ok(())
}
