//! KV pages in device memory: for each page slot (a layer's place in its group's pages) one
//! buffer of K then V, each `[KV head][page][position]` rows of the page type (f16 values or
//! Q8_0 blocks; the kv_write kernels).

use std::sync::Arc;

use tallow_backend::{BackendError, KvCopy};
use tallow_kv::{KvError, KvLayout, LayerGroups, PageId, PageStore};

use crate::gpu::{Buffer, Device, DevicePtr, Gpu};

/// The KV pages of a cache.
pub struct Pages<G: Gpu> {
    device: Arc<Device<G>>,
    layout: KvLayout,
    n_pages: usize,
    /// The buffer of each page slot.
    slots: Vec<Buffer<G>>,
    /// The page slot of each layer.
    slot_of: Vec<usize>,
}

impl<G: Gpu> Pages<G> {
    /// A pool of `n_pages` zeroed pages of `layout`.
    pub(crate) fn new(
        device: &Arc<Device<G>>,
        layout: KvLayout,
        groups: &LayerGroups,
        n_pages: usize,
    ) -> Result<Self, BackendError> {
        layout.validate()?;
        groups.check_layout(&layout)?;
        let bytes = 2 * layout.n_head_kv * n_pages * layout.page_size * layout.row_bytes();
        let slots = (0..layout.page_layers)
            .map(|_| Buffer::zeroed(device, bytes))
            .collect::<Result<_, _>>()?;
        Ok(Pages {
            device: Arc::clone(device),
            layout,
            n_pages,
            slots,
            slot_of: groups.slots(),
        })
    }

    /// The pages of `layer`.
    pub(crate) fn of_layer(&self, layer: usize) -> Result<DevicePtr, KvError> {
        let slot = self.slot_of.get(layer).ok_or(KvError::OutOfRange {
            what: "layer",
            index: layer,
            len: self.slot_of.len(),
        })?;
        Ok(self.slots[*slot].ptr())
    }

    /// Pages in the pool.
    pub(crate) fn n_pages(&self) -> usize {
        self.n_pages
    }

    /// Copies positions `0..copy.len` of page `copy.src` to page `copy.dst` in `layer`.
    pub(crate) fn copy_positions(&self, copy: &KvCopy, layer: usize) -> Result<(), BackendError> {
        self.check(copy.src)?;
        self.check(copy.dst)?;
        if copy.len > self.layout.page_size {
            return Err(BackendError::InvalidArgument(format!(
                "copy of {} positions from a page of {}",
                copy.len, self.layout.page_size
            )));
        }
        let buffer = self.of_layer(layer)?;
        self.copy_blocks(
            buffer,
            copy.src,
            copy.dst,
            copy.len * self.layout.row_bytes(),
        )
    }

    /// Copies the first `bytes` of each (kind, head) block of page `src` to page `dst`.
    fn copy_blocks(
        &self,
        buffer: DevicePtr,
        src: PageId,
        dst: PageId,
        bytes: usize,
    ) -> Result<(), BackendError> {
        let block = self.block_bytes();
        let at = |page: PageId, b: usize| buffer.offset((b * self.n_pages + page.index()) * block);
        for b in 0..2 * self.layout.n_head_kv {
            self.device.gpu.copy(at(src, b), at(dst, b), bytes)?;
        }
        Ok(())
    }

    /// Bytes of one (K or V, head, page) block.
    fn block_bytes(&self) -> usize {
        self.layout.page_size * self.layout.row_bytes()
    }

    fn check(&self, page: PageId) -> Result<(), KvError> {
        if page.index() >= self.n_pages {
            return Err(KvError::PageOutOfRange {
                page,
                n_pages: self.n_pages,
            });
        }
        Ok(())
    }
}

impl<G: Gpu> PageStore for Pages<G> {
    fn layout(&self) -> &KvLayout {
        &self.layout
    }

    fn n_pages(&self) -> usize {
        self.n_pages
    }

    fn copy_page(&mut self, src: PageId, dst: PageId) -> Result<(), KvError> {
        self.check(src)?;
        self.check(dst)?;
        let block = self.block_bytes();
        for slot in &self.slots {
            self.copy_blocks(slot.ptr(), src, dst, block)
                .map_err(|e| KvError::Device(e.to_string()))?;
        }
        Ok(())
    }
}
