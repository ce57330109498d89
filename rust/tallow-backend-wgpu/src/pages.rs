//! KV pages in GPU memory: for each page slot (a layer's place in its group's pages) one
//! buffer of K then V, each `[KV head][page][position][head_dim]` f16 values.

use std::sync::Arc;

use tallow_backend::{BackendError, KvCopy};
use tallow_kv::{KvError, KvLayout, LayerGroups, PageId, PageStore};

use crate::gpu::{Buffer, Gpu};

pub struct Pages {
    gpu: Arc<Gpu>,
    layout: KvLayout,
    n_pages: usize,
    /// The buffer of each page slot.
    slots: Vec<Buffer>,
    /// The page slot of each layer.
    slot_of: Vec<usize>,
}

impl Pages {
    /// A pool of `n_pages` zeroed pages of `layout`, whose type and heads the backend has
    /// checked against its capabilities (f16, heads of an even size).
    pub(crate) fn new(
        gpu: Arc<Gpu>,
        layout: KvLayout,
        groups: &LayerGroups,
        n_pages: usize,
    ) -> Result<Pages, BackendError> {
        layout.validate()?;
        groups.check_layout(&layout)?;
        let slot_of = groups.slots();
        let bytes = 2 * (layout.n_head_kv * n_pages * layout.block_len() * 2) as u64;
        let slots = (0..layout.page_layers)
            .map(|_| gpu.zeroed(bytes))
            .collect::<Result<_, _>>()?;
        Ok(Pages {
            gpu,
            layout,
            n_pages,
            slots,
            slot_of,
        })
    }

    /// The buffer holding `layer`'s pages.
    pub(crate) fn of_layer(&self, layer: usize) -> &Buffer {
        &self.slots[self.slot_of[layer]]
    }

    /// Records into `encoder` the copy of positions `0..len` of page `src` to page `dst` in
    /// `layer` (through a staging buffer: a buffer cannot be copied onto itself).
    pub(crate) fn record_copy(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        copy: &KvCopy,
        layer: usize,
    ) -> Result<(), BackendError> {
        for page in [copy.src, copy.dst] {
            if page.index() >= self.n_pages {
                return Err(KvError::PageOutOfRange {
                    page,
                    n_pages: self.n_pages,
                }
                .into());
            }
        }
        if copy.len > self.layout.page_size {
            return Err(BackendError::InvalidArgument(format!(
                "copy of {} positions from a page of {}",
                copy.len, self.layout.page_size
            )));
        }
        let (block, blocks) = (self.block_bytes(), 2 * self.layout.n_head_kv as u64);
        let bytes = (copy.len * self.layout.head_dim * 2) as u64;
        let staging = self.gpu.zeroed(bytes * blocks)?;
        let buffer = self.of_layer(layer);
        let at = |page: PageId, b: u64| (b * self.n_pages as u64 + page.index() as u64) * block;
        for b in 0..blocks {
            encoder.copy_buffer_to_buffer(buffer, at(copy.src, b), &staging, b * bytes, bytes);
        }
        for b in 0..blocks {
            encoder.copy_buffer_to_buffer(&staging, b * bytes, buffer, at(copy.dst, b), bytes);
        }
        Ok(())
    }

    /// Bytes of one (page, kind, head) block.
    fn block_bytes(&self) -> u64 {
        (self.layout.block_len() * 2) as u64
    }
}

impl PageStore for Pages {
    fn layout(&self) -> &KvLayout {
        &self.layout
    }

    fn n_pages(&self) -> usize {
        self.n_pages
    }

    fn copy_page(&mut self, src: PageId, dst: PageId) -> Result<(), KvError> {
        for page in [src, dst] {
            if page.index() >= self.n_pages {
                return Err(KvError::PageOutOfRange {
                    page,
                    n_pages: self.n_pages,
                });
            }
        }
        // A buffer cannot be copied onto itself: through a buffer of one page's blocks.
        let block = self.block_bytes();
        let blocks = 2 * self.layout.n_head_kv as u64;
        let device_error = |e: BackendError| KvError::Device(e.to_string());
        let staging = self
            .gpu
            .zeroed(block * blocks * self.slots.len() as u64)
            .map_err(device_error)?;
        let at = |page: PageId, b: u64| (b * self.n_pages as u64 + page.index() as u64) * block;
        let mut encoder = self.gpu.device.create_command_encoder(&Default::default());
        for (s, buffer) in self.slots.iter().enumerate() {
            for b in 0..blocks {
                let staged = (s as u64 * blocks + b) * block;
                encoder.copy_buffer_to_buffer(buffer, at(src, b), &staging, staged, block);
            }
        }
        for (s, buffer) in self.slots.iter().enumerate() {
            for b in 0..blocks {
                let staged = (s as u64 * blocks + b) * block;
                encoder.copy_buffer_to_buffer(&staging, staged, buffer, at(dst, b), block);
            }
        }
        self.gpu
            .checked(|_| self.gpu.queue.submit([encoder.finish()]))
            .map_err(device_error)?;
        Ok(())
    }
}
