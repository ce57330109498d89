//! Layer groups: which layers share a page table, and how far back each group keeps K/V.
//!
//! A model whose layers all attend to the whole sequence has one group: a page holds every
//! layer's K/V for its positions. A model with sliding-window layers (Gemma 2/3, Mistral)
//! splits its layers into groups of equal size, each group holding layers of one window only,
//! so that a page belongs to one group and every page has the same size (one pool, one free
//! list). Each sequence has one page table per group; a windowed group gives back the pages no
//! query can see any more, which bounds its memory by the window whatever the context length.
//!
//! Gemma 3 with 18 layers, 3 global and 15 local: groups of 3 layers, one global group and five
//! local ones; a token takes six pages' worth of slots (as one page of 18 layers would), but
//! at 8k context the local groups keep about `window / page_size + 2` pages each.

use crate::error::{KvError, Result};
use crate::layout::KvLayout;

/// The layers of one group and the window they attend within.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerGroup {
    /// Positions a query sees, itself included; `None` for global attention.
    pub window: Option<usize>,
    /// The model layers whose K/V this group's pages hold, in page-slot order.
    pub layers: Vec<usize>,
}

/// How a model's layers map onto page tables and page slots.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerGroups {
    groups: Vec<LayerGroup>,
    /// For each model layer: (group, slot within the group's pages).
    place: Vec<(usize, usize)>,
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

impl LayerGroups {
    /// One group of `n_layer` global layers (no sliding window).
    pub fn global(n_layer: usize) -> Result<Self> {
        Self::from_windows(&vec![None; n_layer])
    }

    /// Groups for layers with these windows (`windows[layer]`; `None` = global attention):
    /// the layers of each window, in order, cut into groups of the greatest size that divides
    /// every window's layer count.
    pub fn from_windows(windows: &[Option<usize>]) -> Result<Self> {
        if windows.is_empty() {
            return Err(KvError::InvalidLayout("n_layer must be at least 1".into()));
        }
        if windows.contains(&Some(0)) {
            return Err(KvError::InvalidLayout(
                "a sliding window must hold at least one position".into(),
            ));
        }
        // Distinct windows in order of first appearance, with their layers.
        let mut classes: Vec<(Option<usize>, Vec<usize>)> = Vec::new();
        for (layer, &w) in windows.iter().enumerate() {
            match classes.iter_mut().find(|(cw, _)| *cw == w) {
                Some((_, layers)) => layers.push(layer),
                None => classes.push((w, vec![layer])),
            }
        }
        let size = classes.iter().fold(0, |g, (_, l)| gcd(g, l.len()));
        let mut groups = Vec::new();
        let mut place = vec![(0, 0); windows.len()];
        for (window, layers) in classes {
            for members in layers.chunks(size) {
                for (slot, &layer) in members.iter().enumerate() {
                    place[layer] = (groups.len(), slot);
                }
                groups.push(LayerGroup {
                    window,
                    layers: members.to_vec(),
                });
            }
        }
        Ok(LayerGroups { groups, place })
    }

    /// The groups, in page-table order.
    pub fn groups(&self) -> &[LayerGroup] {
        &self.groups
    }

    /// Number of groups (page tables per sequence).
    pub fn len(&self) -> usize {
        self.groups.len()
    }

    /// Whether there is no group (never: a model has a layer).
    pub fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }

    /// Model layers.
    pub fn n_layer(&self) -> usize {
        self.place.len()
    }

    /// Layers whose K/V one page holds (every group has this many).
    pub fn page_layers(&self) -> usize {
        self.groups[0].layers.len()
    }

    /// The window of each group, in order.
    pub fn windows(&self) -> Vec<Option<usize>> {
        self.groups.iter().map(|g| g.window).collect()
    }

    /// Checks that these groups cut `layout`'s layers into pages of `layout.page_layers`.
    pub fn check_layout(&self, layout: &KvLayout) -> Result<()> {
        if (self.n_layer(), self.page_layers()) != (layout.n_layer, layout.page_layers) {
            return Err(KvError::InvalidLayout(format!(
                "layer groups of {} layers in pages of {} do not fit a layout of {} layers in \
                 pages of {}",
                self.n_layer(),
                self.page_layers(),
                layout.n_layer,
                layout.page_layers
            )));
        }
        Ok(())
    }

    /// The page slot of every model layer, in layer order.
    pub fn slots(&self) -> Vec<usize> {
        self.place.iter().map(|&(_, slot)| slot).collect()
    }

    /// The group and page slot of model layer `layer`.
    pub fn place(&self, layer: usize) -> Result<(usize, usize)> {
        self.place.get(layer).copied().ok_or(KvError::OutOfRange {
            what: "layer",
            index: layer,
            len: self.place.len(),
        })
    }

    /// The most pages a sequence of `n_tokens` tokens holds at once when it grows in appends
    /// of at most `chunk` tokens (an upper bound for windowed groups), over all groups.
    pub fn pages_to_hold(&self, n_tokens: usize, chunk: usize, page_size: usize) -> usize {
        let all = n_tokens.div_ceil(page_size);
        self.groups
            .iter()
            .map(|g| match g.window {
                None => all,
                // An append of c tokens at q keeps positions q + 1 - w .. q + c: pages
                // floor((q + 1 - w) / ps) .. ceil((q + c) / ps).
                Some(w) => all.min((w - 1 + chunk.max(1)).div_ceil(page_size) + 1),
            })
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn global_layers_form_one_group() {
        let g = LayerGroups::global(4).unwrap();
        assert_eq!(g.len(), 1);
        assert_eq!(g.page_layers(), 4);
        assert_eq!(g.place(3).unwrap(), (0, 3));
        assert!(g.place(4).is_err());
        assert_eq!(g.pages_to_hold(33, 1, 16), 3);
    }

    #[test]
    fn gemma3_pattern_splits_into_equal_groups_of_one_window() {
        // Five local layers, then a global one, three times.
        let windows: Vec<_> = (0..18)
            .map(|l| if l % 6 == 5 { None } else { Some(512) })
            .collect();
        let g = LayerGroups::from_windows(&windows).unwrap();
        assert_eq!(g.page_layers(), 3);
        assert_eq!(g.len(), 6);
        let layers: Vec<_> = g.groups().iter().map(|g| g.layers.clone()).collect();
        assert_eq!(
            layers,
            vec![
                vec![0, 1, 2],
                vec![3, 4, 6],
                vec![7, 8, 9],
                vec![10, 12, 13],
                vec![14, 15, 16],
                vec![5, 11, 17],
            ]
        );
        assert_eq!(g.windows()[5], None);
        assert_eq!(g.place(6).unwrap(), (1, 2));
        assert_eq!(g.place(17).unwrap(), (5, 2));
        // 8k tokens: the global group keeps 512 pages, each local one at most 33.
        assert_eq!(g.pages_to_hold(8192, 1, 16), 512 + 5 * 33);
        // Short sequences keep every page.
        assert_eq!(g.pages_to_hold(100, 1, 16), 6 * 7);
        // Appends of 256 tokens hold the window and the chunk.
        assert_eq!(g.pages_to_hold(8192, 256, 16), 512 + 5 * 49);
    }

    #[test]
    fn alternating_windows_and_odd_counts() {
        let g = LayerGroups::from_windows(&[Some(8), None, Some(8), None]).unwrap();
        assert_eq!((g.len(), g.page_layers()), (2, 2));
        let g = LayerGroups::from_windows(&[Some(8), Some(8), None]).unwrap();
        assert_eq!((g.len(), g.page_layers()), (3, 1));
        assert!(LayerGroups::from_windows(&[]).is_err());
        assert!(LayerGroups::from_windows(&[Some(0)]).is_err());
    }
}
