# cython: language_level=3
"""Byte-pair encoding in C (csrc/bpe.c): the Qwen2 split pattern, the merge loop, a word cache.

`qwenc.tokenizer.Tokenizer` is the public face; this module only moves bytes and ids across.
Encoding runs without the GIL (a long prompt must not stall the threads streaming other
requests), one call at a time per model: its scratch buffers and word cache are not thread-safe.
"""
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.list cimport PyList_New, PyList_SET_ITEM
from cpython.long cimport PyLong_Check, PyLong_FromLong
from cpython.number cimport PyNumber_Index
from cpython.pythread cimport (PyThread_acquire_lock, PyThread_allocate_lock, PyThread_free_lock,
                               PyThread_release_lock, PyThread_type_lock, WAIT_LOCK)
from cpython.ref cimport Py_INCREF
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.stdint cimport int32_t, uint8_t, uint32_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy

cdef extern from "bpe.h":
    ctypedef struct bpe_model:
        pass
    int BPE_FLAG_NO_LOOKAHEAD
    int BPE_FLAG_LEFT_TO_RIGHT
    bpe_model *bpe_new()
    void bpe_free(bpe_model *m)
    const char *bpe_error(const bpe_model *m)
    int bpe_load_tokens(bpe_model *m, const char *blob, size_t len, int32_t n_tokens, const uint8_t *in_vocab)
    int bpe_load_merges(bpe_model *m, const char *blob, size_t len, int32_t n_merges)
    void bpe_set_ignore_merges(bpe_model *m, int on)
    void bpe_set_flags(bpe_model *m, int flags)
    size_t bpe_encode(bpe_model *m, const char *text, size_t len, int32_t *out) nogil
    size_t bpe_pretoken_end(const bpe_model *m, const char *text, size_t len, size_t pos)
    const char *bpe_token_bytes(const bpe_model *m, int32_t id, size_t *len)
    unsigned bpe_char_class(uint32_t cp)

FLAG_NO_LOOKAHEAD = BPE_FLAG_NO_LOOKAHEAD
FLAG_LEFT_TO_RIGHT = BPE_FLAG_LEFT_TO_RIGHT

# Kinds of id in BPE.kinds: not a token (a gap or padding), a plain token, a special token.
KIND_NONE = 0
KIND_PLAIN = 1
KIND_SPECIAL = 2


def char_class(uint32_t cp):
    """Class bits of a code point as the split pattern sees it: 1 letter, 2 number, 4 space, 8 CR/LF."""
    return bpe_char_class(cp)


cdef class BPE:
    """Vocabulary, merges and the encode/decode loops of one tokenizer.

    token_blob: every token string (byte-level alphabet), '\\n'-separated, in id order.
    in_vocab:   one byte per id, nonzero for tokens the merge loop may produce.
    kinds:      one byte per id, KIND_NONE / KIND_PLAIN / KIND_SPECIAL (for decode).
    merge_blob: merges as "left right", '\\n'-separated, best rank first.
    """
    cdef bpe_model *m
    cdef PyThread_type_lock lock  # held around bpe_encode, which runs without the GIL
    cdef readonly int32_t n_tokens
    cdef bytes kinds

    def __cinit__(self, bytes token_blob, int n_tokens, bytes in_vocab, bytes kinds,
                  bytes merge_blob, int n_merges, bint ignore_merges=False):
        if len(in_vocab) != n_tokens or len(kinds) != n_tokens:
            raise ValueError("in_vocab and kinds need one byte per token")
        self.lock = PyThread_allocate_lock()
        self.m = bpe_new()
        if self.m == NULL or self.lock == NULL:
            raise MemoryError()
        if bpe_load_tokens(self.m, token_blob, len(token_blob), n_tokens, in_vocab) != 0:
            raise ValueError(bpe_error(self.m).decode("utf-8", "replace"))
        if bpe_load_merges(self.m, merge_blob, len(merge_blob), n_merges) != 0:
            raise ValueError(bpe_error(self.m).decode("utf-8", "replace"))
        bpe_set_ignore_merges(self.m, ignore_merges)
        self.n_tokens = n_tokens
        self.kinds = kinds

    def __dealloc__(self):
        bpe_free(self.m)
        if self.lock != NULL:
            PyThread_free_lock(self.lock)

    def set_flags(self, int flags):
        """Switch on deliberately wrong behaviours (FLAG_*), for tests; 0 restores the real ones."""
        bpe_set_flags(self.m, flags)

    def encode(self, bytes text):
        """Token ids of UTF-8 text that holds no added tokens and is already normalized."""
        cdef Py_ssize_t n = PyBytes_GET_SIZE(text)
        cdef const char *src = PyBytes_AS_STRING(text)  # `text` keeps it alive, and bytes do not change
        cdef int32_t *out = <int32_t *>malloc((n + 1) * sizeof(int32_t))
        cdef size_t k, i
        if out == NULL:
            raise MemoryError()
        try:
            with nogil:
                PyThread_acquire_lock(self.lock, WAIT_LOCK)
                k = bpe_encode(self.m, src, <size_t>n, out)
                PyThread_release_lock(self.lock)
            if k == <size_t>-1:
                raise MemoryError()
            ids = PyList_New(<Py_ssize_t>k)
            for i in range(k):
                item = PyLong_FromLong(out[i])
                Py_INCREF(item)
                PyList_SET_ITEM(ids, <Py_ssize_t>i, item)
            return ids
        finally:
            free(out)

    def pretokenize(self, bytes text):
        """The pieces the split pattern cuts UTF-8 text into (for tests and debugging)."""
        cdef size_t n = <size_t>PyBytes_GET_SIZE(text), p = 0, e
        cdef const char *s = PyBytes_AS_STRING(text)
        pieces = []
        while p < n:
            e = bpe_pretoken_end(self.m, s, n, p)
            pieces.append(text[p:e])
            p = e
        return pieces

    cdef int32_t checked_id(self, object x) except -1:
        cdef long long v
        if not PyLong_Check(x):
            x = PyNumber_Index(x)  # numpy integers pass; floats and strings raise TypeError
        try:
            v = x
        except OverflowError:
            raise IndexError(f"token id {x} is out of range") from None
        if v < 0 or v >= self.n_tokens or (<const uint8_t *>PyBytes_AS_STRING(self.kinds))[v] == KIND_NONE:
            raise IndexError(f"token id {v} is not a token of this vocabulary")
        return <int32_t>v

    def token_bytes(self, id):
        """Raw bytes of one token."""
        cdef size_t n
        cdef const char *p = bpe_token_bytes(self.m, self.checked_id(id), &n)
        return PyBytes_FromStringAndSize(p, <Py_ssize_t>n)

    def decode_bytes(self, ids, bint skip_special=False):
        """Raw bytes of a token sequence (special tokens left out when skip_special)."""
        cdef const uint8_t *kinds = <const uint8_t *>PyBytes_AS_STRING(self.kinds)
        cdef Py_ssize_t total = 0, pos = 0, j, count
        cdef size_t n
        cdef int32_t *buf
        cdef const char *p
        cdef char *dst
        if not isinstance(ids, (list, tuple)):
            ids = list(ids)
        count = len(ids)
        buf = <int32_t *>malloc((count + 1) * sizeof(int32_t))
        if buf == NULL:
            raise MemoryError()
        try:
            for j in range(count):
                buf[j] = self.checked_id(ids[j])
                if not (skip_special and kinds[buf[j]] == KIND_SPECIAL):
                    bpe_token_bytes(self.m, buf[j], &n)
                    total += <Py_ssize_t>n
            out = PyBytes_FromStringAndSize(NULL, total)
            dst = PyBytes_AS_STRING(out)
            for j in range(count):
                if not (skip_special and kinds[buf[j]] == KIND_SPECIAL):
                    p = bpe_token_bytes(self.m, buf[j], &n)
                    memcpy(dst + pos, p, n)
                    pos += <Py_ssize_t>n
            return out
        finally:
            free(buf)

    def decode(self, ids, bint skip_special=False):
        """Text of a token sequence; invalid UTF-8 becomes U+FFFD."""
        cdef bytes raw = self.decode_bytes(ids, skip_special)
        return PyUnicode_DecodeUTF8(PyBytes_AS_STRING(raw), PyBytes_GET_SIZE(raw), "replace")
