"""Which KV blocks belong to whom: reference counts, the free queue, and the prefix cache.

The engine's KVCache (qwenc.model) is one pool of fixed-size blocks. A request holds a list of
block ids (its block table); a block may be held by several requests at once when they share a
prefix, so every block has a reference count. A full block is also identified by a hash of its
tokens and of everything before it (the parent block's hash): a later request whose prompt
starts with the same tokens finds those blocks by hash and reuses their keys and values instead
of computing them again.

Blocks nobody holds wait in the free queue, oldest release first. Allocation takes from its head:
blocks never used come first, then cached blocks in least-recently-released order, their hashes
forgotten as they are taken (LRU eviction). A cached block asked for again before it is taken
leaves the queue.

The hash is SHA-256, not Python's hash(): requests come from many users, and a collision crafted
by one would hand another user's keys and values to it.
"""
import hashlib
from collections import OrderedDict

import numpy as np


class OutOfBlocks(Exception):
    """The pool has fewer free blocks than asked for (nothing was allocated)."""


def block_hashes(tokens, block_size: int, parent: bytes = b"", first: int = 0):
    """The chain of hashes of the full blocks of `tokens` from block `first` on (entry i
    identifies tokens [0, (first + i + 1) * block_size)); `parent` is the hash of block
    first - 1 (b"" for the start of a sequence)."""
    out = []
    n_full = len(tokens) // block_size
    arr = np.asarray(tokens[first * block_size:n_full * block_size], dtype="<i4")
    for i in range(n_full - first):
        h = hashlib.sha256(parent)
        h.update(arr[i * block_size:(i + 1) * block_size].tobytes())
        parent = h.digest()
        out.append(parent)
    return out


class BlockPool:
    """Reference-counted blocks 0 .. num_blocks-1 with a hash-indexed prefix cache."""

    def __init__(self, num_blocks: int, block_size: int):
        self.num_blocks, self.block_size = int(num_blocks), int(block_size)
        self.refs = [0] * self.num_blocks
        self.hash_of = [None] * self.num_blocks      # the hash a cached block is filed under
        self.cached = {}                              # hash -> block id
        self.free = OrderedDict((b, None) for b in range(self.num_blocks))  # ref 0, LRU order
        self.hits = self.queries = 0                  # prefix-cache blocks found / looked up

    # -- counts ------------------------------------------------------------------------------

    @property
    def num_free(self) -> int:
        """Blocks that can be allocated now (free, cached or not)."""
        return len(self.free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self.free)

    @property
    def num_cached(self) -> int:
        """Blocks filed in the prefix cache (held or not)."""
        return len(self.cached)

    @property
    def num_cached_free(self) -> int:
        """Cached blocks nobody holds (what eviction may take)."""
        return sum(1 for b in self.free if self.hash_of[b] is not None)

    # -- allocation --------------------------------------------------------------------------

    def allocate(self, n: int) -> list:
        """n blocks with reference count 1, or OutOfBlocks (then nothing changes)."""
        if n > len(self.free):
            raise OutOfBlocks(f"{n} blocks asked for, {len(self.free)} free")
        out = []
        for _ in range(n):
            b, _ = self.free.popitem(last=False)
            h = self.hash_of[b]
            if h is not None:  # evict: its old contents are about to be overwritten
                if self.cached.get(h) == b:
                    del self.cached[h]
                self.hash_of[b] = None
            self.refs[b] = 1
            out.append(b)
        return out

    def release(self, blocks):
        """Drop one reference to each block (a request finished or was cancelled). Blocks back at
        zero join the tail of the free queue, cached ones still findable by hash. Released in
        reverse so a sequence's last blocks are evicted before its first (which more requests
        are likely to share)."""
        for b in reversed(blocks):
            if self.refs[b] <= 0:
                raise AssertionError(f"block {b} released more often than held")
            self.refs[b] -= 1
            if self.refs[b] == 0:
                self.free[b] = None

    # -- the prefix cache --------------------------------------------------------------------

    def lookup(self, hashes) -> list:
        """The cached blocks for the longest run of `hashes` from the start, each now held once
        more by the caller."""
        found = []
        for h in hashes:
            b = self.cached.get(h)
            if b is None:
                break
            found.append(b)
        self.queries += len(hashes)
        self.hits += len(found)
        for b in found:
            if self.refs[b] == 0:
                del self.free[b]
            self.refs[b] += 1
        return found

    def peek(self, hashes) -> int:
        """How many of `hashes` (from the start) are cached, without taking them."""
        n = 0
        for h in hashes:
            if h not in self.cached:
                break
            n += 1
        return n

    def register(self, block: int, h: bytes):
        """File a full block (held by the caller) under its hash. When another block already
        holds those tokens the first one stays filed: both have the same contents."""
        if self.hash_of[block] is not None or h in self.cached:
            return
        self.cached[h] = block
        self.hash_of[block] = h

    def reset_cache(self):
        """Forget every cached hash (blocks held stay held)."""
        self.cached.clear()
        self.hash_of = [None] * self.num_blocks

    def check(self, holders):
        """Assert the pool's books balance against `holders`, the block tables of every live
        request: each block's count equals the tables holding it, free blocks are exactly those
        held by none, and the cache index and the blocks agree. For tests."""
        count = [0] * self.num_blocks
        for table in holders:
            for b in table:
                count[b] += 1
        assert count == self.refs, "reference counts differ from the block tables holding them"
        assert set(self.free) == {b for b in range(self.num_blocks) if count[b] == 0}, "free queue wrong"
        for h, b in self.cached.items():
            assert self.hash_of[b] == h, "cache index and block disagree"
        assert sum(h is not None for h in self.hash_of) == len(self.cached), "stray block hash"
