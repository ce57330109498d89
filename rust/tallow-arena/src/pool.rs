//! A pool that recycles arenas.

use std::fmt;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::Arena;

/// A thread-safe pool of equally sized arenas.
///
/// [`get`](ArenaPool::get) pops an idle arena, or creates one only when none is idle; the
/// returned [`PooledArena`] resets its arena and pushes it back when dropped. Once the pool holds
/// as many arenas as are ever in use at once, taking and returning one makes no heap allocation:
/// the idle list's capacity is reserved whenever an arena is created, never on return.
///
/// The idle list is a `Vec` behind a [`Mutex`] rather than a lock-free stack: it is touched
/// twice per engine step, almost never contended, and the critical section is a push or a pop.
/// A lock-free (Treiber) stack of owned arenas would need a heap node per entry or an intrusive
/// link plus ABA protection (tagged pointers or hazard pointers) for no measurable gain; std's
/// futex-based mutex takes one uncontended atomic operation and allocates nothing.
pub struct ArenaPool {
    arena_capacity: usize,
    idle: Mutex<Vec<Arena>>,
    created: AtomicUsize,
}

impl ArenaPool {
    /// Creates an empty pool whose arenas each have `arena_capacity` bytes.
    pub fn new(arena_capacity: usize) -> ArenaPool {
        ArenaPool {
            arena_capacity,
            idle: Mutex::new(Vec::new()),
            created: AtomicUsize::new(0),
        }
    }

    /// Creates a pool holding `count` idle arenas already, so the first `count` concurrent
    /// [`get`](ArenaPool::get)s allocate nothing.
    pub fn with_arenas(arena_capacity: usize, count: usize) -> ArenaPool {
        let pool = ArenaPool::new(arena_capacity);
        {
            let mut idle = pool.lock();
            idle.reserve_exact(count);
            idle.extend((0..count).map(|_| Arena::new(arena_capacity)));
        }
        pool.created.store(count, Ordering::Relaxed);
        pool
    }

    /// Capacity in bytes of each arena this pool creates.
    pub fn arena_capacity(&self) -> usize {
        self.arena_capacity
    }

    /// Number of arenas waiting in the pool.
    pub fn idle(&self) -> usize {
        self.lock().len()
    }

    /// Number of arenas this pool has created in total (idle plus handed out).
    pub fn created(&self) -> usize {
        self.created.load(Ordering::Relaxed)
    }

    /// Takes an idle arena (empty: arenas are reset on return), creating one if none is idle.
    ///
    /// # Panics
    /// If a new arena must be created and its buffer cannot be allocated (see [`Arena::new`]).
    pub fn get(&self) -> PooledArena<'_> {
        let mut idle = self.lock();
        let arena = match idle.pop() {
            Some(arena) => arena,
            None => {
                // Counted and reserved under the lock, so that the idle list always has room
                // for every arena the pool owns and returning one never allocates. The new
                // buffer is also allocated under the lock: rare, and it keeps `created` exact.
                let created = self.created.load(Ordering::Relaxed) + 1;
                idle.reserve(created);
                let arena = Arena::new(self.arena_capacity);
                self.created.store(created, Ordering::Relaxed);
                arena
            }
        };
        PooledArena {
            arena: Some(arena),
            pool: self,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Arena>> {
        // A panic while the lock was held cannot leave the Vec inconsistent (push/pop only).
        self.idle.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl fmt::Debug for ArenaPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ArenaPool")
            .field("arena_capacity", &self.arena_capacity)
            .field("idle", &self.idle())
            .field("created", &self.created())
            .finish()
    }
}

/// An arena borrowed from an [`ArenaPool`]; dereferences to [`Arena`]. Dropping it resets the
/// arena and returns it to the pool.
pub struct PooledArena<'pool> {
    /// Always `Some` until `drop` takes it.
    arena: Option<Arena>,
    pool: &'pool ArenaPool,
}

impl Deref for PooledArena<'_> {
    type Target = Arena;

    fn deref(&self) -> &Arena {
        self.arena.as_ref().expect("arena present until drop")
    }
}

impl DerefMut for PooledArena<'_> {
    fn deref_mut(&mut self) -> &mut Arena {
        self.arena.as_mut().expect("arena present until drop")
    }
}

impl Drop for PooledArena<'_> {
    fn drop(&mut self) {
        if let Some(mut arena) = self.arena.take() {
            arena.reset();
            // Never reallocates: `get` reserved room for every arena the pool has created.
            self.pool.lock().push(arena);
        }
    }
}

impl fmt::Debug for PooledArena<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("PooledArena").field(&**self).finish()
    }
}
