//! The pooling allocator's address-space reservation and the backend that runs policies, sized
//! from configuration so that a 32-bit node (armv7: at most 3 GiB of address space for
//! everything) can start, while a 64-bit node keeps the guard regions that let compiled code skip
//! bounds checks.
//!
//! Sans-IO: [`slot_layout`] turns the memory cap, the instance count and the reservation (of
//! the engine's `Limits`) into the per-slot reservation and guard that the engine configures;
//! nothing here maps memory.

use serde::{Deserialize, Serialize};

use crate::PolicyError;

/// Which code runs policies.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// Cranelift-compiled native code where Cranelift has a backend for the host (x86_64,
    /// aarch64), the Pulley interpreter elsewhere (armv7).
    #[default]
    Auto,
    /// Cranelift-compiled native code; refused on hosts Cranelift cannot compile for.
    Native,
    /// wasmtime's portable Pulley bytecode interpreter (slower per point; runs everywhere).
    Pulley,
}

/// Whether Cranelift can compile native code for the host this was built for.
pub const NATIVE_AVAILABLE: bool =
    cfg!(any(target_arch = "x86_64", target_arch = "aarch64", target_arch = "riscv64", target_arch = "s390x"));

/// Whether this build is for a 32-bit host, where address space is the scarce resource.
const HOST_32_BIT: bool = cfg!(target_pointer_width = "32");

/// A 32-bit memory index spans 4 GiB: a slot this large (plus the guard) lets Cranelift drop
/// bounds checks.
const FULL_RESERVATION: u64 = 1 << 32;
/// The guard after a full slot: accesses with a static offset below it need no check.
const FULL_GUARD: u64 = 32 << 20;
/// Most address space a 32-bit process can give the pool; the rest is the node itself.
const MAX_32_BIT_RESERVATION: u64 = 2 << 30;
const WASM_PAGE: u64 = 64 << 10;

impl Backend {
    /// Whether this backend, on this host, runs policies on the Pulley interpreter.
    pub fn is_pulley(self) -> bool {
        match self {
            Backend::Auto => !NATIVE_AVAILABLE,
            Backend::Native => false,
            Backend::Pulley => true,
        }
    }

    /// The wasmtime target triple to configure, if not the host's default.
    pub(crate) fn target(self) -> Result<Option<&'static str>, PolicyError> {
        match self {
            Backend::Native if !NATIVE_AVAILABLE => Err(PolicyError::Config(
                "backend = \"native\": Cranelift cannot compile for this host; use \"auto\" or \"pulley\"".into(),
            )),
            Backend::Pulley if HOST_32_BIT => Ok(Some("pulley32")),
            Backend::Pulley => Ok(Some("pulley64")),
            Backend::Auto | Backend::Native => Ok(None),
        }
    }
}

/// The address space the pool reserves for linear memories by default: on a 64-bit host with
/// native code, a full 4 GiB slot and guard per instance (virtual only; bounds checks are elided);
/// elsewhere exactly one memory cap per instance.
pub fn default_reservation(memory_bytes: u64, max_instances: u32, backend: Backend) -> u64 {
    let per_slot = if !HOST_32_BIT && !backend.is_pulley() { FULL_RESERVATION + FULL_GUARD } else { memory_bytes };
    per_slot.saturating_mul(u64::from(max_instances.max(1)))
}

/// How each pool slot is laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SlotLayout {
    /// Address space reserved for one linear memory (`Config::memory_reservation`).
    pub(crate) reservation: u64,
    /// Inaccessible bytes after it (`Config::memory_guard_size`).
    pub(crate) guard: u64,
}

impl SlotLayout {
    /// Bytes of address space the pool's linear memories take for `slots` instances.
    pub(crate) fn total(&self, slots: u32) -> u64 {
        (self.reservation + self.guard).saturating_mul(u64::from(slots))
    }
}

/// Splits `reservation_bytes` over the pool's `max_instances` slots of at most `memory_bytes`
/// each, run by `backend`, or explains why it cannot be.
pub(crate) fn slot_layout(
    memory_bytes: u64,
    max_instances: u32,
    reservation_bytes: u64,
    backend: Backend,
) -> Result<SlotLayout, PolicyError> {
    let slots = u64::from(max_instances.max(1));
    let per_slot = reservation_bytes / slots / WASM_PAGE * WASM_PAGE;
    let mib = |b: u64| b >> 20;
    if per_slot < memory_bytes {
        return Err(PolicyError::Config(format!(
            "reservation_mib = {} gives each of the {slots} instances (max_instances) {} MiB of address space, less \
             than its memory cap (memory_mib = {}); raise reservation_mib or lower max_instances or memory_mib",
            mib(reservation_bytes),
            mib(per_slot),
            mib(memory_bytes)
        )));
    }
    if HOST_32_BIT && reservation_bytes > MAX_32_BIT_RESERVATION {
        return Err(PolicyError::Config(format!(
            "reservation_mib = {} does not fit a 32-bit process (at most {} MiB for policies); lower reservation_mib, \
             max_instances or memory_mib",
            mib(reservation_bytes),
            mib(MAX_32_BIT_RESERVATION)
        )));
    }
    // Pulley checks bounds itself and cannot use guard pages; native code can when a whole
    // 4 GiB index space fits.
    let layout = if !backend.is_pulley() && per_slot >= FULL_RESERVATION + FULL_GUARD {
        SlotLayout { reservation: per_slot - FULL_GUARD, guard: FULL_GUARD }
    } else {
        SlotLayout { reservation: per_slot, guard: 0 }
    };
    Ok(layout)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::Limits;

    fn limits(memory_mib: u64, instances: u32, reservation_mib: u64, backend: Backend) -> Limits {
        Limits {
            memory_bytes: memory_mib << 20,
            max_instances: instances,
            reservation_bytes: reservation_mib << 20,
            backend,
            ..Limits::default()
        }
    }

    fn slot_layout(l: &Limits) -> Result<SlotLayout, PolicyError> {
        super::slot_layout(l.memory_bytes, l.max_instances, l.reservation_bytes, l.backend)
    }

    #[test]
    fn a_small_reservation_is_split_evenly_without_guards() {
        let layout = slot_layout(&limits(16, 8, 128, Backend::Auto)).unwrap();
        assert_eq!(layout, SlotLayout { reservation: 16 << 20, guard: 0 });
        assert_eq!(layout.total(8), 128 << 20);
        // Odd sizes round down to whole WebAssembly pages.
        let layout = slot_layout(&limits(1, 3, 100, Backend::Auto)).unwrap();
        assert_eq!(layout.reservation % WASM_PAGE, 0);
        assert!(layout.total(3) <= 100 << 20);
    }

    #[test]
    fn a_full_slot_gets_a_guard_unless_interpreted() {
        let full = (FULL_RESERVATION + FULL_GUARD) * 2;
        let native = slot_layout(&limits(64, 2, full >> 20, Backend::Native)).unwrap();
        assert_eq!(native, SlotLayout { reservation: FULL_RESERVATION, guard: FULL_GUARD });
        let pulley = slot_layout(&limits(64, 2, full >> 20, Backend::Pulley)).unwrap();
        assert_eq!(pulley.guard, 0);
    }

    #[test]
    fn too_small_a_reservation_is_explained() {
        let err = slot_layout(&limits(64, 8, 256, Backend::Auto)).unwrap_err().to_string();
        assert!(
            err.contains("reservation_mib = 256") && err.contains("32 MiB") && err.contains("memory_mib = 64"),
            "{err}"
        );
    }

    #[test]
    fn the_default_fits_the_host() {
        let l = Limits::default();
        let layout = slot_layout(&l).unwrap();
        if HOST_32_BIT {
            assert!(layout.total(l.max_instances) <= MAX_32_BIT_RESERVATION);
        } else {
            assert_eq!(layout.guard, FULL_GUARD, "64-bit native code keeps its guard regions");
        }
        assert_eq!(default_reservation(16 << 20, 8, Backend::Pulley), 128 << 20);
    }
}
