//! Hand-written ingest-policy components in the WebAssembly text format, for what a Rust guest
//! built with wit-bindgen never does: several memories, aliased strings in a result, reading
//! memory a previous call may have left behind. A hostile module is signed like any other, so
//! the host must hold its limits against these too.
//!
//! The component is a `libc` core module (the memory and a bump `realloc`), the policy's own
//! core module `main` (which imports them and the host's `log`, and exports `process` in the
//! canonical ABI), and the wit-component style wrapper that exports
//! `timeshard:policy/ingest@0.1.0` with named types.
//!
//! `process`'s core signature: 14 `i32` parameters (series key, metric and tags, config, then
//! the batch's `ts`, `value` and `event` lists as pointer/length pairs: locals 8 to 13) and an
//! `i32` result, the address of the `result<ingest-output, string>`: a discriminant byte at
//! +0, then either `keep` (three pointer/length pairs at +4) and `rejected` (+28), or the error
//! string (+4). The first 64 KiB of memory are free for the module's own use; `realloc` places
//! the arguments above them.

#![allow(dead_code)]

/// The parts of a crafted component.
pub struct Crafted<'a> {
    /// Initial pages of the memory.
    pub pages: u32,
    /// The fields of the `main` core module after its imports (`$realloc`, `$log` and memory
    /// 0): must export `process`.
    pub main: &'a str,
    /// More fields of the `libc` core module, which defines the memory (e.g. data segments:
    /// the memory's initial image).
    pub libc: &'a str,
    /// More component-level items, placed before the policy (e.g. other core modules).
    pub extra: &'a str,
}

impl Default for Crafted<'_> {
    fn default() -> Self {
        Crafted { pages: 1, main: RETURN_INPUT, libc: "", extra: "" }
    }
}

/// A `process` that keeps the batch as it is.
pub const RETURN_INPUT: &str = r#"
    (func (export "process") (param i32 i32 i32 i32 i32 i32 i32 i32 i32 i32 i32 i32 i32 i32) (result i32)
      (i32.store8 (i32.const 0) (i32.const 0))
      (i32.store (i32.const 4) (local.get 8))
      (i32.store (i32.const 8) (local.get 9))
      (i32.store (i32.const 12) (local.get 10))
      (i32.store (i32.const 16) (local.get 11))
      (i32.store (i32.const 20) (local.get 12))
      (i32.store (i32.const 24) (local.get 13))
      (i32.store (i32.const 28) (i32.const 0))
      (i32.store (i32.const 32) (i32.const 0))
      (i32.const 0))
"#;

/// The component's bytes.
pub fn ingest_component(c: &Crafted<'_>) -> Vec<u8> {
    let Crafted { pages, main, libc, extra } = c;
    let text = format!(
        r#"
(component
  (import "timeshard:policy/host@0.1.0" (instance $host
    (type $l (enum "debug" "info" "warn" "error"))
    (export "level" (type $level (eq $l)))
    (type $logf (func (param "level" $level) (param "message" string)))
    (export "log" (func (type $logf)))
  ))
  (alias export $host "log" (func $log))
  {extra}

  (core module $libc_m
    (memory (export "memory") {pages})
    (global $heap (mut i32) (i32.const 65536))
    (func (export "realloc") (param $old i32) (param $old_len i32) (param $align i32) (param $new i32) (result i32)
      (local $p i32)
      (local.set $p (i32.and (i32.add (global.get $heap) (i32.sub (local.get $align) (i32.const 1)))
                             (i32.sub (i32.const 0) (local.get $align))))
      (global.set $heap (i32.add (local.get $p) (local.get $new)))
      (block $ok
        (br_if $ok (i32.le_u (global.get $heap) (i32.mul (memory.size) (i32.const 65536))))
        (br_if $ok (i32.ne (memory.grow (i32.sub (i32.add (i32.shr_u (global.get $heap) (i32.const 16)) (i32.const 1))
                                                 (memory.size)))
                           (i32.const -1)))
        unreachable)
      (local.get $p))
    {libc}
  )
  (core instance $libc (instantiate $libc_m))
  (core func $log_core (canon lower (func $log) (memory (core memory $libc "memory"))))
  (core instance $hostcore (export "log" (func $log_core)))

  (core module $main_m
    (import "libc" "memory" (memory 1))
    (import "libc" "realloc" (func $realloc (param i32 i32 i32 i32) (result i32)))
    (import "host" "log" (func $log (param i32 i32 i32)))
    {main}
  )
  (core instance $main (instantiate $main_m (with "libc" (instance $libc)) (with "host" (instance $hostcore))))

  (import "timeshard:policy/types@0.1.0" (instance $types
    (type $s0 (record (field "name" string) (field "value" string)))
    (export "setting" (type $s (eq $s0)))
    (type $se0 (record (field "key" string) (field "metric" string) (field "tags" (list $s))))
    (export "series" (type (eq $se0)))
    (type $p0 (record (field "ts" (list s64)) (field "value" (list f64)) (field "event" (list u64))))
    (export "points" (type $p (eq $p0)))
    (type $r0 (record (field "index" u32) (field "reason" string)))
    (export "rejection" (type $r (eq $r0)))
    (type $o0 (record (field "keep" $p) (field "rejected" (list $r))))
    (export "ingest-output" (type (eq $o0)))
  ))
  (alias export $types "setting" (type $setting))
  (alias export $types "series" (type $series))
  (alias export $types "points" (type $points))
  (alias export $types "rejection" (type $rejection))
  (alias export $types "ingest-output" (type $output))
  (type $process_t (func (param "series" $series) (param "config" (list $setting)) (param "batch" $points)
                         (result (result $output (error string)))))
  (func $process (type $process_t)
    (canon lift (core func $main "process") (memory (core memory $libc "memory")) (realloc (core func $libc "realloc"))))

  (component $shim
    (type $setting0 (record (field "name" string) (field "value" string)))
    (import "import-type-setting" (type $setting (eq $setting0)))
    (type $series0 (record (field "key" string) (field "metric" string) (field "tags" (list $setting))))
    (import "import-type-series" (type $series (eq $series0)))
    (type $points0 (record (field "ts" (list s64)) (field "value" (list f64)) (field "event" (list u64))))
    (import "import-type-points" (type $points (eq $points0)))
    (type $rejection0 (record (field "index" u32) (field "reason" string)))
    (import "import-type-rejection" (type $rejection (eq $rejection0)))
    (type $output0 (record (field "keep" $points) (field "rejected" (list $rejection))))
    (import "import-type-ingest-output" (type $output (eq $output0)))
    (type $f0 (func (param "series" $series) (param "config" (list $setting)) (param "batch" $points)
                    (result (result $output (error string)))))
    (import "import-func-process" (func $f (type $f0)))
    (export $setting_e "setting" (type $setting))
    (export $series_e "series" (type $series))
    (export $points_e "points" (type $points))
    (export $rejection_e "rejection" (type $rejection))
    (export $output_e "ingest-output" (type $output))
    (type $f1 (func (param "series" $series_e) (param "config" (list $setting_e)) (param "batch" $points_e)
                    (result (result $output_e (error string)))))
    (export "process" (func $f) (func (type $f1)))
  )
  (instance $ingest (instantiate $shim
    (with "import-func-process" (func $process))
    (with "import-type-setting" (type $setting))
    (with "import-type-series" (type $series))
    (with "import-type-points" (type $points))
    (with "import-type-rejection" (type $rejection))
    (with "import-type-ingest-output" (type $output))))
  (export "timeshard:policy/ingest@0.1.0" (instance $ingest))
)
"#
    );
    wat::parse_str(&text).unwrap_or_else(|e| panic!("crafted component: {e}"))
}
