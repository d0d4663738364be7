/* Byte-level BPE for Qwen tokenizers: pre-tokenizer, rank-ordered merge loop, word cache.
 *
 * The model works on raw bytes.  Vocabulary strings arrive in the byte-level alphabet that
 * GPT-2-style tokenizers use (each byte shown as one printable code point, e.g. space as U+0120)
 * and are mapped back to bytes once, at load.  Added/special tokens are split out by the caller
 * before text reaches bpe_encode; NFC normalization is the caller's too.
 *
 * A model is not thread-safe: bpe_encode reuses per-model scratch buffers and a word cache.
 */
#ifndef QWENC_BPE_H
#define QWENC_BPE_H

#include <stddef.h>
#include <stdint.h>

typedef struct bpe_model bpe_model;

/* Character classes used by the pre-tokenizer (bit flags; NL is also WS). */
enum { BPE_CLASS_L = 1, BPE_CLASS_N = 2, BPE_CLASS_WS = 4, BPE_CLASS_NL = 8 };

/* Deliberately wrong behaviours, for tests that prove the parity suite can tell them apart. */
enum {
    BPE_FLAG_NO_LOOKAHEAD = 1,   /* drop the `\s+(?!\S)` alternative of the split pattern */
    BPE_FLAG_LEFT_TO_RIGHT = 2,  /* merge the leftmost mergeable pair instead of the best-ranked */
};

bpe_model *bpe_new(void);
void bpe_free(bpe_model *m);

/* Message for the last failed load call (static storage inside the model). */
const char *bpe_error(const bpe_model *m);

/* Load n_tokens token strings (UTF-8, byte-level alphabet), separated by '\n' in `blob`.
 * in_vocab[i] != 0 marks tokens the merge loop may produce; others (added tokens, gaps) are
 * kept only for decoding.  A token that is not in the byte-level alphabet decodes to its UTF-8
 * text.  Returns 0, or -1 with bpe_error set. */
int bpe_load_tokens(bpe_model *m, const char *blob, size_t len, int32_t n_tokens, const uint8_t *in_vocab);

/* Load merges "left right", separated by '\n'; rank = position.  Call after bpe_load_tokens. */
int bpe_load_merges(bpe_model *m, const char *blob, size_t len, int32_t n_merges);

/* When set, a pre-token that is itself a vocabulary entry is emitted whole (HF ignore_merges). */
void bpe_set_ignore_merges(bpe_model *m, int on);

/* Testing knobs (BPE_FLAG_*); also clears the word cache. */
void bpe_set_flags(bpe_model *m, int flags);

/* Pre-tokenize and encode UTF-8 text.  `out` must hold at least `len` ids (one token never
 * covers less than one byte).  Returns the number of ids written, or (size_t)-1 when out of
 * memory. */
size_t bpe_encode(bpe_model *m, const char *text, size_t len, int32_t *out);

/* End (byte offset) of the pre-token that starts at byte `pos` of `text`. */
size_t bpe_pretoken_end(const bpe_model *m, const char *text, size_t len, size_t pos);

/* Raw bytes of token `id` (caller checks the range); *len receives the length. */
const char *bpe_token_bytes(const bpe_model *m, int32_t id, size_t *len);

int32_t bpe_n_tokens(const bpe_model *m);

/* Character class bits of a code point (BPE_CLASS_*), as the split pattern sees it. */
unsigned bpe_char_class(uint32_t cp);

#endif
