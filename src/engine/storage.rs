//! Storages: one allocator request each (engine.md §0.3). A storage is freed
//! the moment its last reference — from tensors or from saved slots — goes.

use crate::alloc::{AllocError, Tag};
use serde::{Deserialize, Serialize};

use super::error::{EngineError, Result};
use super::events::EngineEvent;
use super::tag::Category;
use super::Engine;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct StorageId(pub u32);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum DeviceKind {
    Cuda,
    Cpu,
}

#[derive(Debug, Clone)]
pub(crate) struct Storage {
    pub device: DeviceKind,
    /// Exact requested bytes (engine.md §1.2); the allocator rounds.
    pub bytes: u64,
    /// Allocator address; None for CPU storages and 0-byte tensors.
    pub addr: Option<u64>,
    pub tensor_refs: u32,
    /// References from saved slots and checkpoint recompute buffers.
    pub slot_refs: u32,
    /// Held by the engine itself (cuBLAS workspaces, cuDNN dropout state).
    pub engine_refs: u32,
    /// Version counter shared by all views (engine.md §2.6).
    pub version: u32,
    pub tag: Tag,
    pub category: Category,
    pub iteration: u32,
}

impl Engine {
    /// A new GPU storage of exactly `bytes`, tagged with the current op context.
    /// 0 bytes never reaches the allocator (engine.md §1.2).
    pub(crate) fn new_storage(&mut self, bytes: u64, category: Category) -> Result<StorageId> {
        if self.ckpt.should_stop() {
            return Err(EngineError::StopRecompute);
        }
        let tag = self.current_tag(category);
        let addr = if bytes == 0 {
            None
        } else {
            let r = self.alloc.malloc(bytes, 0, tag);
            self.pull_alloc_events();
            match r {
                Ok(a) => Some(a),
                Err(AllocError::OutOfMemory(info)) => {
                    return Err(EngineError::OutOfMemory {
                        message: info.message.clone(),
                        requested: bytes,
                    })
                }
                Err(e) => return Err(EngineError::Alloc(e.to_string())),
            }
        };
        let id = self.storages.insert(Storage {
            device: DeviceKind::Cuda,
            bytes,
            addr,
            tensor_refs: 0,
            slot_refs: 0,
            engine_refs: 0,
            version: 0,
            tag,
            category,
            iteration: self.ctx.iteration,
        });
        Ok(StorageId(id))
    }

    /// A host storage: tracked for the views, never on the GPU timeline (§1.5).
    pub(crate) fn new_cpu_storage(&mut self, bytes: u64, category: Category) -> StorageId {
        let tag = self.current_tag(category);
        StorageId(self.storages.insert(Storage {
            device: DeviceKind::Cpu,
            bytes,
            addr: None,
            tensor_refs: 0,
            slot_refs: 0,
            engine_refs: 0,
            version: 0,
            tag,
            category,
            iteration: self.ctx.iteration,
        }))
    }

    pub(crate) fn storage(&self, s: StorageId) -> &Storage {
        &self.storages[s.0]
    }

    pub(crate) fn retain_storage_slot(&mut self, s: StorageId) {
        self.storages[s.0].slot_refs += 1;
    }

    pub(crate) fn release_storage_slot(&mut self, s: StorageId) {
        let st = &mut self.storages[s.0];
        st.slot_refs -= 1;
        self.maybe_free_storage(s);
    }

    pub(crate) fn release_storage_tensor(&mut self, s: StorageId) {
        let st = &mut self.storages[s.0];
        st.tensor_refs -= 1;
        self.maybe_free_storage(s);
    }

    pub(crate) fn release_storage_engine(&mut self, s: StorageId) {
        let st = &mut self.storages[s.0];
        st.engine_refs -= 1;
        self.maybe_free_storage(s);
    }

    fn maybe_free_storage(&mut self, s: StorageId) {
        let st = &self.storages[s.0];
        if st.tensor_refs > 0 || st.slot_refs > 0 || st.engine_refs > 0 {
            return;
        }
        if let Some(st) = self.storages.remove(s.0) {
            if let Some(addr) = st.addr {
                // A free of an address we own cannot fail; if it does the
                // engine's bookkeeping is wrong, which the error event reports.
                if let Err(e) = self.alloc.free(addr) {
                    self.events.push(EngineEvent::Error {
                        kind: super::error::ErrorKind::Internal,
                        message: format!("allocator refused a free: {e}"),
                    });
                }
                self.pull_alloc_events();
            }
        }
    }

    /// Move the allocator's trace entries into the engine's event stream.
    pub(crate) fn pull_alloc_events(&mut self) {
        for ev in self.alloc.drain_events() {
            self.events.push(EngineEvent::Alloc(ev));
        }
    }

    /// Storage bytes on the GPU that are currently referenced by saved slots.
    pub fn saved_storage_bytes(&self) -> u64 {
        self.storages
            .iter()
            .filter(|(_, s)| s.slot_refs > 0 && s.device == DeviceKind::Cuda)
            .map(|(_, s)| s.bytes)
            .sum()
    }

    /// Number of live storages (GPU and CPU).
    pub fn live_storages(&self) -> usize {
        self.storages.len()
    }
}
