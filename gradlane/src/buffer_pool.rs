//! Large send buffers kept for reuse once quinn is done with them.
//!
//! quinn holds a sent buffer until the peer acknowledged all of it, so a
//! buffer handed over cannot be reused at once; one made fresh for every
//! large message costs a page fault per 4 KiB (a 100 MB message, about
//! 25,000). A [`BufferPool`]'s buffers go back to it when quinn drops
//! them, and the next message of about that size takes one.

use bytes::Bytes;
use std::sync::{Arc, Mutex, MutexGuard};

/// Byte buffers to fill and hand to quinn, reused once it drops them.
#[derive(Debug)]
pub struct BufferPool {
    free: Mutex<Free>,
    /// The most bytes of free buffers kept; past it a dropped buffer is
    /// freed.
    max_bytes: usize,
}

#[derive(Debug, Default)]
struct Free {
    buffers: Vec<Vec<u8>>,
    bytes: usize,
}

impl BufferPool {
    /// A pool keeping at most `max_bytes` of free buffers.
    pub fn new(max_bytes: usize) -> Arc<Self> {
        Arc::new(Self {
            free: Mutex::default(),
            max_bytes,
        })
    }

    fn lock(&self) -> MutexGuard<'_, Free> {
        self.free.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// An empty buffer with room for at least `len` bytes: the smallest
    /// free one that has it, else a new one.
    pub fn take(&self, len: usize) -> Vec<u8> {
        let mut free = self.lock();
        let fit = (free.buffers.iter().enumerate())
            .filter(|(_, b)| b.capacity() >= len)
            .min_by_key(|(_, b)| b.capacity())
            .map(|(i, _)| i);
        match fit {
            Some(i) => {
                let mut b = free.buffers.swap_remove(i);
                free.bytes -= b.capacity();
                b.clear();
                b
            }
            None => Vec::with_capacity(len),
        }
    }

    /// `buf` as [`Bytes`] that come back to this pool when the last
    /// clone is dropped.
    pub fn freeze(self: &Arc<Self>, buf: Vec<u8>) -> Bytes {
        Bytes::from_owner(Pooled {
            buf,
            pool: self.clone(),
        })
    }

    /// A copy of `data` in a pooled buffer.
    pub fn copy_of(self: &Arc<Self>, data: &[u8]) -> Bytes {
        let mut buf = self.take(data.len());
        buf.extend_from_slice(data);
        self.freeze(buf)
    }

    /// The bytes of free buffers held now.
    pub fn free_bytes(&self) -> usize {
        self.lock().bytes
    }
}

/// A buffer that returns to its pool when quinn drops it.
struct Pooled {
    buf: Vec<u8>,
    pool: Arc<BufferPool>,
}

impl AsRef<[u8]> for Pooled {
    fn as_ref(&self) -> &[u8] {
        &self.buf
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        let buf = std::mem::take(&mut self.buf);
        let mut free = self.pool.lock();
        if free.bytes + buf.capacity() <= self.pool.max_bytes {
            free.bytes += buf.capacity();
            free.buffers.push(buf);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dropped_buffer_is_taken_again_by_a_message_it_fits() {
        let pool = BufferPool::new(1 << 20);
        let sent = pool.copy_of(&[7u8; 1000]);
        assert_eq!(&sent[..3], &[7, 7, 7]);
        let held = sent.clone();
        drop(sent);
        assert_eq!(pool.free_bytes(), 0, "a clone still holds it");
        drop(held);
        assert!(pool.free_bytes() >= 1000);
        let again = pool.take(500);
        assert!(again.capacity() >= 1000 && again.is_empty());
        assert_eq!(pool.free_bytes(), 0);
    }

    #[test]
    fn the_smallest_fitting_buffer_is_taken_and_the_pool_is_bounded() {
        let pool = BufferPool::new(10_000);
        let (small, large) = (pool.copy_of(&[1; 2000]), pool.copy_of(&[2; 6000]));
        let too_many = pool.copy_of(&[3; 4000]);
        drop((small, large, too_many));
        assert!(pool.free_bytes() <= 10_000, "{}", pool.free_bytes());
        assert!(pool.take(1500).capacity() < 6000, "the small one fits");
        assert!(pool.take(5000).capacity() >= 6000);
        assert!(pool.take(9000).capacity() >= 9000, "none fits: a new one");
    }
}
