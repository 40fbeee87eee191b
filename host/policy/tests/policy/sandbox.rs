//! Hostile components written by hand (see `crafted`): the limits hold against what a
//! wit-bindgen guest never does. Each is signed with the trusted key, as a hostile or broken
//! module from the fleet's own build would be.

use timeshard_policy::{Binding, Bindings, FailureKind, Kind, Limits, PolicyError, Settings};

use crate::common::*;
use crate::crafted::*;

/// Installs a crafted component as `crafted@1.0.0` and binds it as the ingest policy of every
/// series.
fn install(f: &Fixture, crafted: &Crafted<'_>, settings: Settings) -> Result<(), PolicyError> {
    let bytes = ingest_component(crafted);
    f.registry.install(f.module_from_bytes("crafted", "1.0.0", Kind::Ingest, bytes, settings))?;
    f.registry.bind(Bindings(vec![Binding { ingest: Some("crafted".parse().unwrap()), ..Binding::default() }]))
}

#[test]
fn a_crafted_component_runs() {
    let f = Fixture::new();
    install(&f, &Crafted::default(), Settings::default()).unwrap();
    let out = f.registry.ingest(&series(), points(&[1.0, 2.0])).unwrap();
    assert_eq!(out.keep, points(&[1.0, 2.0]));
}

/// A core module whose 16 MiB memory is touched page by page when it is instantiated.
const HOG: &str = r#"
  (core module $hog
    (memory 256)
    (func $touch (local $a i32)
      (loop $pages
        (i32.store8 (local.get $a) (i32.const 1))
        (local.set $a (i32.add (local.get $a) (i32.const 4096)))
        (br_if $pages (i32.lt_u (local.get $a) (i32.const 16777216)))))
    (start $touch))
"#;

#[test]
fn more_memories_do_not_multiply_the_memory_cap() {
    // Each memory stays under the 16 MiB cap, so a cap checked memory by memory let two more
    // (32 MiB, resident) through, taking three slots of a pool sized for one memory per call.
    let extra = format!("{HOG} {}", "(core instance (instantiate $hog))\n".repeat(2));
    let f = Fixture::new();
    let capped = Settings { memory_mib: Some(16), ..Settings::default() };
    let err = install(&f, &Crafted { extra: &extra, ..Crafted::default() }, capped).unwrap_err();
    assert_eq!(err.kind(), FailureKind::Malformed, "{err}");
    assert!(err.to_string().contains("3 Wasm linear memories"), "{err}");
    assert!(f.registry.running().is_empty());
}

#[test]
fn one_component_cannot_take_the_pool_from_the_others() {
    // A pool of 4 slots holds 16 core instances; this component instantiates 14, so while it
    // runs (here: until its deadline), no other policy could be instantiated.
    let f = Fixture::with_limits(Limits { max_instances: 4, ..test_limits() });
    let extra = format!("(core module $empty) {}", "(core instance (instantiate $empty))\n".repeat(12));
    let looping = r#"(func (export "process") (param i32 i32 i32 i32 i32 i32 i32 i32 i32 i32 i32 i32 i32 i32)
                       (result i32) (loop $forever (br $forever)) (i32.const 0))"#;
    let settings = Settings { deadline_ms: Some(500), ..Settings::default() };
    let err = install(&f, &Crafted { extra: &extra, main: looping, ..Crafted::default() }, settings).unwrap_err();
    assert_eq!(err.kind(), FailureKind::Malformed, "{err}");
    assert!(err.to_string().contains("core module instances"), "{err}");
}

#[test]
fn a_result_cannot_make_the_host_copy_more_than_the_guest_holds() {
    // Ten rejections whose reasons are one 12 MiB string of the guest's memory: the guest holds
    // 12 MiB, copying the result out took 120 MiB on the host (each reason is lifted whole
    // before it is truncated), for a policy capped at 16 MiB.
    let main = r#"
    (func (export "process") (param i32 i32 i32 i32 i32 i32 i32 i32 i32 i32 i32 i32 i32 i32) (result i32)
      (local $reason i32) (local $i i32)
      (local.set $reason (i32.mul (memory.grow (i32.const 192)) (i32.const 65536)))
      (loop $each
        (i32.store (i32.add (i32.const 4096) (i32.mul (local.get $i) (i32.const 12))) (local.get $i))
        (i32.store (i32.add (i32.const 4100) (i32.mul (local.get $i) (i32.const 12))) (local.get $reason))
        (i32.store (i32.add (i32.const 4104) (i32.mul (local.get $i) (i32.const 12))) (i32.const 12582912))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br_if $each (i32.lt_u (local.get $i) (i32.const 10))))
      (i32.store8 (i32.const 0) (i32.const 0))
      (i32.store (i32.const 4) (i32.const 0))
      (i32.store (i32.const 8) (i32.const 0))
      (i32.store (i32.const 12) (i32.const 0))
      (i32.store (i32.const 16) (i32.const 0))
      (i32.store (i32.const 20) (i32.const 0))
      (i32.store (i32.const 24) (i32.const 0))
      (i32.store (i32.const 28) (i32.const 4096))
      (i32.store (i32.const 32) (i32.const 10))
      (i32.const 0))
    "#;
    let f = Fixture::new();
    let capped = Settings { memory_mib: Some(16), ..Settings::default() };
    install(&f, &Crafted { pages: 2, main, ..Crafted::default() }, capped).unwrap();
    let Err(err) = f.registry.ingest(&series(), points(&[0.0; 10])) else {
        panic!("the host copied the ten 12 MiB reasons out of the guest");
    };
    assert_eq!(err.kind(), FailureKind::BadOutput, "{err}");
    assert!(err.to_string().contains("16 MiB"), "{err}");
}

/// A policy that, given a batch whose first value is 1, 3 or 4, dirties its memory (its initial
/// image, the rest of its initial pages, and 24 MiB more that it grows, beyond the 4 MiB the
/// pool keeps resident) and then returns, traps or loops past its deadline; given 2, it checks
/// that none of that is visible: the memory has its initial size and contents.
const DIRTY_OR_CHECK: &str = r#"
    (data (i32.const 2048) "memory left by an earlier call")
    (func (export "process") (param i32 i32 i32 i32 i32 i32 i32 i32 i32 i32 i32 i32 i32 i32) (result i32)
      (local $mode f64) (local $a i32) (local $end i32) (local $bad i32)
      (local.set $mode (f64.load (local.get 10)))
      (if (f64.eq (local.get $mode) (f64.const 2))
        (then
          (local.set $bad (i32.ne (memory.size) (i32.const 2)))
          (local.set $bad (i32.or (local.get $bad) (i32.ne (i32.load8_u (i32.const 32768)) (i32.const 73))))
          (local.set $bad (i32.or (local.get $bad) (i32.load8_u (i32.const 40000))))
          (local.set $bad (i32.or (local.get $bad) (i32.load8_u (i32.const 120000))))
          (local.set $a (i32.mul (memory.grow (i32.const 384)) (i32.const 65536)))
          (local.set $end (i32.mul (memory.size) (i32.const 65536)))
          (loop $pages
            (local.set $bad (i32.or (local.get $bad) (i32.load8_u (local.get $a))))
            (local.set $bad (i32.or (local.get $bad) (i32.load8_u (i32.add (local.get $a) (i32.const 40961)))))
            (local.set $a (i32.add (local.get $a) (i32.const 65536)))
            (br_if $pages (i32.lt_u (local.get $a) (local.get $end)))))
        (else
          (i32.store8 (i32.const 32768) (i32.const 171))
          (i32.store8 (i32.const 40000) (i32.const 171))
          (i32.store8 (i32.const 120000) (i32.const 171))
          (local.set $a (i32.mul (memory.grow (i32.const 384)) (i32.const 65536)))
          (local.set $end (i32.mul (memory.size) (i32.const 65536)))
          (loop $pages
            (i32.store8 (local.get $a) (i32.const 171))
            (i32.store8 (i32.add (local.get $a) (i32.const 40961)) (i32.const 171))
            (local.set $a (i32.add (local.get $a) (i32.const 65536)))
            (br_if $pages (i32.lt_u (local.get $a) (local.get $end))))
          (if (f64.eq (local.get $mode) (f64.const 3)) (then unreachable))
          (if (f64.eq (local.get $mode) (f64.const 4)) (then (loop $forever (br $forever))))))
      (if (local.get $bad)
        (then
          (i32.store8 (i32.const 0) (i32.const 1))
          (i32.store (i32.const 4) (i32.const 2048))
          (i32.store (i32.const 8) (i32.const 30))
          (return (i32.const 0))))
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

#[test]
fn a_recycled_instance_shows_nothing_of_the_previous_call() {
    // The pool recycles a slot for the next call of the same module, resetting in place only
    // the pages the last call dirtied: whatever way that call ended, the next one must see
    // the memory as a fresh instance has it.
    let f = Fixture::new();
    let settings = Settings { deadline_ms: Some(200), ..Settings::default() };
    let crafted =
        Crafted { pages: 2, main: DIRTY_OR_CHECK, libc: r#"(data (i32.const 32768) "IMAGE")"#, ..Crafted::default() };
    install(&f, &crafted, settings).unwrap();
    let check = || f.registry.ingest(&series(), points(&[2.0])).unwrap();
    check();
    for (mode, reps, ends) in
        [(1.0, 10, None), (3.0, 10, Some(FailureKind::Trap)), (4.0, 3, Some(FailureKind::Timeout))]
    {
        for _ in 0..reps {
            let dirty = f.registry.ingest(&series(), points(&[mode]));
            assert_eq!(dirty.as_ref().err().map(PolicyError::kind), ends, "{dirty:?}");
            check();
        }
    }
}

#[test]
fn more_concurrent_calls_than_pool_slots_wait_for_a_slot() {
    // The node runs ingest policies on as many blocking threads as writes arrive (up to 512),
    // and the pool has `max_instances` slots. A call that found the pool full failed with
    // Instantiate: under load, batches were refused, or with pass-through stored unvalidated.
    let f = std::sync::Arc::new(Fixture::with_limits(Limits { max_instances: 2, ..test_limits() }));
    let busy = r#"
    (func (export "process") (param i32 i32 i32 i32 i32 i32 i32 i32 i32 i32 i32 i32 i32 i32) (result i32)
      (local $n i32)
      (loop $spin
        (local.set $n (i32.add (local.get $n) (i32.const 1)))
        (br_if $spin (i32.lt_u (local.get $n) (i32.const 3000000))))
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
    let pass = Settings { on_failure: timeshard_policy::OnFailure::PassThrough, ..Settings::default() };
    install(&f, &Crafted { main: busy, ..Crafted::default() }, pass).unwrap();
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let f = f.clone();
            std::thread::spawn(move || {
                (0..5).map(|_| f.registry.ingest(&series(), points(&[1.0])).unwrap().passed_through).collect::<Vec<_>>()
            })
        })
        .collect();
    for t in threads {
        for failure in t.join().unwrap() {
            assert_eq!(failure, None, "a batch was passed through unprocessed");
        }
    }
}
