//! Prefix caching on the page tables: exact page reuse (whole pages, then part of one), eviction
//! order (least recently freed first, only when the pool needs pages), and the cases where a
//! page must not be found.

use tallow_kv::{KvError, PageId, PrefixMatch, SeqId, Sequences};

const PS: usize = 4;

fn pages(v: &[u32]) -> Vec<PageId> {
    v.iter().copied().map(PageId).collect()
}

fn free_list(s: &Sequences) -> Vec<PageId> {
    s.allocator().free_pages().collect()
}

/// A sequence holding `tokens`, all written and committed.
fn computed(s: &mut Sequences, tokens: &[u32]) -> SeqId {
    let seq = s.create();
    s.append_slots(seq, tokens.len()).unwrap();
    s.commit(seq, tokens).unwrap();
    seq
}

#[test]
fn freed_full_pages_are_found_again_and_reused_exactly() {
    let mut s = Sequences::new(PS, 8).unwrap();
    let prompt: Vec<u32> = (100..110).collect();
    let a = computed(&mut s, &prompt);
    assert_eq!(s.page_table(a, 0).unwrap(), pages(&[0, 1, 2]));
    // The two full pages are cached, the partly filled third is not.
    assert!(s.is_cached(PageId(0)) && s.is_cached(PageId(1)) && !s.is_cached(PageId(2)));
    assert_eq!(s.stats().prefix.cached_pages, 2);
    s.free(a).unwrap();
    // Freed last page first: cached pages wait at the tail of the free list.
    assert_eq!(free_list(&s), pages(&[3, 4, 5, 6, 7, 2, 1, 0]));

    // Same first 9 tokens, then different ones.
    let mut other = prompt[..9].to_vec();
    other.extend([7, 7, 7]);
    assert_eq!(
        s.match_prefix(0, &other, other.len() - 1),
        PrefixMatch {
            tokens: 8,
            free_pages: 2
        }
    );
    let b = s.create();
    assert_eq!(s.attach_prefix(b, &other, other.len() - 1).unwrap(), 8);
    assert_eq!(s.page_table(b, 0).unwrap(), pages(&[0, 1]));
    assert_eq!(s.seq_len(b).unwrap(), 8);
    assert_eq!(free_list(&s), pages(&[3, 4, 5, 6, 7, 2]));
    // The rest is computed in a new page from the head of the free list.
    s.append_slots(b, 4).unwrap();
    s.commit(b, &other[8..]).unwrap();
    assert_eq!(s.page_table(b, 0).unwrap(), pages(&[0, 1, 3]));
    let stats = s.stats().prefix;
    assert_eq!((stats.queried_tokens, stats.hit_tokens), (12, 8));
    assert_eq!((stats.cached_pages, stats.evicted_pages), (3, 0));

    // A page in use is shared: a third sequence takes another reference, and the first token
    // of b's last page (108) is the prompt's next one: it takes that page too, for a token.
    let c = s.create();
    assert_eq!(s.attach_prefix(c, &prompt, prompt.len()).unwrap(), 9);
    assert_eq!(s.page_table(c, 0).unwrap(), pages(&[0, 1, 3]));
    assert_eq!(s.allocator().refcount(PageId(0)).unwrap(), 2);
    assert_eq!(s.stats().pages_shared, 3);
}

#[test]
fn eviction_takes_the_least_recently_freed_cached_page_and_only_when_needed() {
    let mut s = Sequences::new(PS, 6).unwrap();
    let first: Vec<u32> = (0..8).collect(); // pages 0, 1
    let second: Vec<u32> = (50..58).collect(); // pages 2, 3
    let a = computed(&mut s, &first);
    let b = computed(&mut s, &second);
    s.free(a).unwrap();
    s.free(b).unwrap();
    assert_eq!(free_list(&s), pages(&[4, 5, 1, 0, 3, 2]));
    assert_eq!(s.stats().prefix.cached_pages, 4);

    // Three pages: the two never-used ones, then the least recently freed cached page.
    let c = s.create();
    s.append_slots(c, 12).unwrap();
    assert_eq!(s.page_table(c, 0).unwrap(), pages(&[4, 5, 1]));
    assert_eq!(s.stats().prefix.evicted_pages, 1);
    assert!(!s.is_cached(PageId(1)));
    // `first` keeps its first page only; `second` is whole.
    assert_eq!(s.match_prefix(0, &first, 8).tokens, 4);
    assert_eq!(s.match_prefix(0, &second, 8).tokens, 8);

    // Another page: page 0 next.
    s.append_slots(c, 4).unwrap();
    assert_eq!(s.page_table(c, 0).unwrap()[3], PageId(0));
    assert_eq!(s.match_prefix(0, &first, 8).tokens, 0);
    assert_eq!(s.stats().prefix.evicted_pages, 2);
}

#[test]
fn pages_in_use_are_never_evicted() {
    let mut s = Sequences::new(PS, 4).unwrap();
    let prompt: Vec<u32> = (0..8).collect();
    let a = computed(&mut s, &prompt);
    let b = s.create();
    s.append_slots(b, 8).unwrap();
    // Every page is in use: no room, although two are cached.
    assert_eq!(
        s.append_slots(b, 1).unwrap_err(),
        KvError::OutOfPages { needed: 1, free: 0 }
    );
    assert_eq!(s.stats().prefix.evicted_pages, 0);
    assert_eq!(s.page_table(a, 0).unwrap(), pages(&[0, 1]));
    assert_eq!(s.match_prefix(0, &prompt, 8).tokens, 8);
}

#[test]
fn salts_keep_prefixes_apart() {
    let mut s = Sequences::new(PS, 8).unwrap();
    let prompt: Vec<u32> = (0..8).collect();
    let a = s.create_salted(7);
    s.append_slots(a, 8).unwrap();
    s.commit(a, &prompt).unwrap();
    assert_eq!(s.match_prefix(0, &prompt, 8).tokens, 0);
    assert_eq!(s.match_prefix(7, &prompt, 8).tokens, 8);
    let plain = s.create();
    assert_eq!(s.attach_prefix(plain, &prompt, 8).unwrap(), 0);
    let salted = s.create_salted(7);
    assert_eq!(s.attach_prefix(salted, &prompt, 8).unwrap(), 8);
}

#[test]
fn a_prefix_is_found_only_up_to_its_first_difference_and_the_token_limit() {
    let mut s = Sequences::new(PS, 8).unwrap();
    let prompt: Vec<u32> = (0..12).collect();
    let a = computed(&mut s, &prompt);
    s.free(a).unwrap();
    // A different token in the second page: the first page, and the second's token before it.
    let mut changed = prompt.clone();
    changed[5] = 99;
    assert_eq!(s.match_prefix(0, &changed, 12).tokens, 5);
    // The same page content at another place in the prompt is another prefix.
    let shifted: Vec<u32> = (4..12).collect();
    assert_eq!(s.match_prefix(0, &shifted, 8).tokens, 0);
    // At most max_tokens: the last prompt token is always computed.
    assert_eq!(s.match_prefix(0, &prompt, 11).tokens, 11);
    assert_eq!(s.match_prefix(0, &prompt, 3).tokens, 3);
    assert_eq!(s.match_prefix(0, &prompt, 0).tokens, 0);
}

#[test]
fn the_same_prefix_computed_twice_is_cached_once() {
    let mut s = Sequences::new(PS, 8).unwrap();
    let prompt: Vec<u32> = (0..8).collect();
    let a = computed(&mut s, &prompt);
    let b = computed(&mut s, &prompt);
    assert_eq!(s.page_table(b, 0).unwrap(), pages(&[2, 3]));
    assert_eq!(s.stats().prefix.cached_pages, 2);
    assert!(!s.is_cached(PageId(2)));
    s.free(a).unwrap();
    s.free(b).unwrap();
    let c = s.create();
    s.attach_prefix(c, &prompt, 8).unwrap();
    assert_eq!(s.page_table(c, 0).unwrap(), pages(&[0, 1]));
}

#[test]
fn truncating_into_a_cached_page_uncaches_it_unless_others_use_it() {
    let mut s = Sequences::new(PS, 8).unwrap();
    let prompt: Vec<u32> = (0..8).collect();
    let a = computed(&mut s, &prompt);
    s.truncate(a, 6).unwrap();
    // Page 1 will be written again: it no longer holds the cached content.
    assert!(s.is_cached(PageId(0)) && !s.is_cached(PageId(1)));
    assert_eq!(s.match_prefix(0, &prompt, 8).tokens, 4);
    // Re-appending and committing other tokens caches the new content.
    s.append_slots(a, 2).unwrap();
    s.commit(a, &[70, 71]).unwrap();
    let mut new = prompt[..6].to_vec();
    new.extend([70, 71]);
    assert_eq!(s.match_prefix(0, &new, 8).tokens, 8);
    // The new page begins as the old did: its first two tokens.
    assert_eq!(s.match_prefix(0, &prompt, 8).tokens, 6);

    // Shared: the page keeps its key, and the truncated sequence copies it on append.
    let b = s.create();
    s.attach_prefix(b, &new, 8).unwrap();
    s.truncate(b, 6).unwrap();
    assert!(s.is_cached(PageId(1)));
    let appended = s.append_slots(b, 1).unwrap();
    assert_eq!(appended.copies.first().map(|c| c.src), Some(PageId(1)));
}

#[test]
fn misuse_is_an_error() {
    let mut s = Sequences::new(PS, 8).unwrap();
    let a = s.create();
    s.append_slots(a, 3).unwrap();
    assert_eq!(
        s.commit(a, &[1, 2, 3, 4]).unwrap_err(),
        KvError::TooManyTokens {
            seq: a,
            len: 3,
            tokens: 4
        }
    );
    assert_eq!(
        s.attach_prefix(a, &[1, 2, 3, 4], 4).unwrap_err(),
        KvError::NotEmpty(a)
    );
    assert!(matches!(
        s.commit(SeqId(99), &[1]),
        Err(KvError::UnknownSequence(_))
    ));
    assert!(
        !s.is_cached(PageId(99)),
        "a page outside the pool is not cached"
    );
}

#[test]
fn part_of_a_page_is_taken_from_the_sibling_that_shares_most_and_copied_on_append() {
    let mut s = Sequences::new(PS, 12).unwrap();
    // Two prompts with the same first page and different second pages.
    let a = computed(&mut s, &[1, 2, 3, 4, 5, 6, 7, 8]);
    let b = computed(&mut s, &[1, 2, 3, 4, 5, 9, 9, 9]);
    s.free(a).unwrap();
    s.free(b).unwrap();
    let prompt = [1, 2, 3, 4, 5, 9, 9, 0, 0];
    let m = s.match_prefix(0, &prompt, prompt.len() - 1);
    // Page 0 and three tokens of b's second page (page 3), both free: two pages revived.
    assert_eq!(
        m,
        PrefixMatch {
            tokens: 7,
            free_pages: 2
        }
    );
    let c = s.create();
    assert_eq!(s.attach_prefix(c, &prompt, prompt.len() - 1).unwrap(), 7);
    assert_eq!(s.page_table(c, 0).unwrap(), pages(&[0, 3]));
    // Page 3 stays cached; the next append takes a copy of it and writes from position 7 on.
    let d = s.create();
    assert_eq!(s.attach_prefix(d, &prompt, prompt.len() - 1).unwrap(), 7);
    let appended = s.append_slots(c, 2).unwrap();
    let copy = appended.copies[0];
    assert_eq!(copy.src, PageId(3));
    assert_eq!(s.page_table(c, 0).unwrap(), pages(&[0, 4, 5]));
    assert_eq!(copy.dst, PageId(4));
    s.commit(c, &prompt[7..]).unwrap();
    assert!(s.is_cached(PageId(3)) && s.is_cached(copy.dst));
    // A whole page is never taken in part: a full match is a whole page.
    assert_eq!(s.match_prefix(0, &[1, 2, 3, 4, 5, 9, 9, 9, 1], 8).tokens, 8);
    s.free(c).unwrap();
    s.free(d).unwrap();
    assert_eq!(s.allocator().n_free(), 12);
    // Alone with the page it took in part, a sequence still copies it: the cache keeps it.
    let e = s.create();
    let other = [1, 2, 3, 4, 5, 6, 7, 1];
    assert_eq!(s.attach_prefix(e, &other, 7).unwrap(), 7);
    assert_eq!(s.page_table(e, 0).unwrap(), pages(&[0, 1]));
    assert_eq!(s.allocator().refcount(PageId(1)).unwrap(), 1);
    assert_eq!(s.append_slots(e, 1).unwrap().copies[0].src, PageId(1));
    assert!(s.is_cached(PageId(1)));
    assert_eq!(s.match_prefix(0, &[1, 2, 3, 4, 5, 6, 7, 8, 0], 8).tokens, 8);
}
