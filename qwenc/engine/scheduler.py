"""What each engine step computes: a token budget filled by running sequences, then by prompts.

Every request is one sequence of tokens (its prompt, then what it has generated) of which the
first `num_computed` have keys and values in the cache; a step feeds each chosen request the
next tokens of that sequence. A decoding request has one token pending, a prefilling one many:
the scheduler treats them alike (chunked prefill). Per step, up to `max_step_tokens` tokens:

1. every running request in order of admission, a decoding one 1 token, a prefilling one a
   chunk of whatever budget is left. So streams keep flowing while a long prompt is read.
2. then waiting requests, first come first served, while fewer than `max_batch` run: a request
   is admitted when blocks for its whole sequence can be had now (after reusing the blocks of
   its cached prefix), so an admitted prompt never stalls half-read for lack of memory.

Decoding grows a sequence by a block every `block_size` tokens. When no block is free the most
recently admitted request is preempted: its blocks go back to the pool (its full blocks stay in
the prefix cache, so its return is mostly cache hits) and it waits at the head of the queue, to
be recomputed from its tokens. Because a row's arithmetic never depends on the rest of the step,
recomputing gives the same keys and values, and the request continues exactly where it was.
"""
from collections import deque
from dataclasses import dataclass

from .kv_pool import BlockPool, OutOfBlocks, block_hashes


def blocks_for(n_tokens: int, block_size: int) -> int:
    return -(-n_tokens // block_size)


@dataclass
class Chunk:
    """One request's part of a step: tokens [start, start + n) of its sequence."""
    req: object
    start: int
    n: int

    @property
    def wants_logits(self) -> bool:
        """Logits are needed when the chunk reaches the end of the sequence (then the next token
        is sampled) or when the request asked for its prompt's log-probabilities."""
        return self.start + self.n == len(self.req.tokens) or self.req.prompt_logprobs


class Scheduler:
    """Queues of requests and the step plan. A request object needs: `tokens` (list of ids),
    `num_computed`, `blocks` (list), `hashes` (list of full-block hashes known so far),
    `n_registered` (leading blocks filed in the prefix cache), `cached_tokens` (None until the
    first admission sets it to the prompt tokens found in the cache), `prompt_logprobs` (bool: no prefix
    reuse, logits for every prompt position) and `on_preempt()` (forget its computed state)."""

    def __init__(self, pool: BlockPool, max_batch: int, max_step_tokens: int):
        self.pool = pool
        self.max_batch = int(max_batch)
        self.max_step_tokens = int(max_step_tokens)
        self.waiting = deque()
        self.running = []        # admission order: the head is served first, the tail preempted first
        self.preemptions = 0

    @property
    def bs(self) -> int:
        return self.pool.block_size

    def add(self, req):
        self.waiting.append(req)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def remove(self, req):
        """Take a request out (finished or cancelled), returning its blocks."""
        if req in self.running:
            self.running.remove(req)
        else:
            try:
                self.waiting.remove(req)
            except ValueError:
                pass
        self.pool.release(req.blocks)
        req.blocks = []

    # -- the plan ----------------------------------------------------------------------------

    def schedule(self) -> list:
        budget = self.max_step_tokens
        plan = []
        planned = set()
        for req in list(self.running):
            if budget == 0:
                break
            if req not in self.running:  # preempted earlier in this loop
                continue
            n = min(len(req.tokens) - req.num_computed, budget)
            if n <= 0:
                continue
            if not self._grow(req, req.num_computed + n, planned):
                continue  # req itself was preempted
            plan.append(Chunk(req, req.num_computed, n))
            planned.add(id(req))
            budget -= n
        skipped = []
        while self.waiting and budget > 0 and len(self.running) < self.max_batch:
            req = self.waiting.popleft()
            if self._defer(req):
                skipped.append(req)
                continue
            if not self._admit(req):
                self.waiting.appendleft(req)
                break
            n = min(len(req.tokens) - req.num_computed, budget)
            plan.append(Chunk(req, req.num_computed, n))
            planned.add(id(req))
            budget -= n
        self.waiting.extendleft(reversed(skipped))
        return plan

    def _grow(self, req, n_tokens: int, planned) -> bool:
        """Give req blocks for n_tokens, preempting later requests as needed; False when req
        itself had to go."""
        need = blocks_for(n_tokens, self.bs) - len(req.blocks)
        while need > self.pool.num_free:
            victim = self.running[-1]
            self._preempt(victim)
            if victim is req:
                return False
            if id(victim) in planned:  # cannot happen: later requests are planned later
                raise AssertionError("preempted a request already planned in this step")
        if need > 0:
            req.blocks.extend(self.pool.allocate(need))
        return True

    def _preempt(self, req):
        self.running.remove(req)
        self.pool.release(req.blocks)
        req.blocks = []
        req.on_preempt()
        self.waiting.appendleft(req)
        self.preemptions += 1

    def _cacheable(self, req) -> int:
        """Leading full blocks of req's sequence that may come from the prefix cache: never the
        block of the last token, whose logits must be computed."""
        if req.prompt_logprobs:
            return 0
        return min(len(req.hashes), (len(req.tokens) - 1) // self.bs)

    def _defer(self, req) -> bool:
        """Hold a request back while another is still computing the same first block (the n
        completions of one prompt, or identical prompts arriving together): once that one's
        blocks are cached, this one reuses them instead of computing them a second time."""
        k = self._cacheable(req)
        if k == 0 or self.pool.peek(req.hashes[:1]):
            return False
        first = req.hashes[0]
        for r in self.running:
            if r.hashes and r.hashes[0] == first and r.num_computed < self.bs:
                return True
        return False

    def _admit(self, req) -> bool:
        k = self._cacheable(req)
        hit = self.pool.lookup(req.hashes[:k]) if k else []
        need = blocks_for(len(req.tokens), self.bs) - len(hit)
        try:
            fresh = self.pool.allocate(need)
        except OutOfBlocks:
            self.pool.release(hit)
            return False
        req.blocks = hit + fresh
        req.num_computed = len(hit) * self.bs
        req.n_registered = len(hit)
        if req.cached_tokens is None:  # what usage reports: the first admission's hits
            req.cached_tokens = req.num_computed
        self.running.append(req)
        return True

    # -- after a step ------------------------------------------------------------------------

    def computed(self, chunk: Chunk):
        """Record that a chunk's tokens are now in the cache, and file the blocks it filled."""
        req = chunk.req
        req.num_computed = chunk.start + chunk.n
        full = req.num_computed // self.bs
        if len(req.hashes) < full:
            parent = req.hashes[-1] if req.hashes else b""
            req.hashes += block_hashes(req.tokens[:full * self.bs], self.bs, parent, len(req.hashes))
        for i in range(req.n_registered, full):
            self.pool.register(req.blocks[i], req.hashes[i])
        req.n_registered = max(req.n_registered, full)
