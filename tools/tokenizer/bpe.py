"""Byte-level BPE over a Hugging Face tokenizer.json (the subset beam-nano uses). Pure Python 3.

Semantics (what the engine's tokenizer must reproduce for the same file):
  * special tokens (`added_tokens`) are matched first when allowed, and their text never reaches the BPE;
  * the rest is split by the o200k pre-tokenizer regex (`Split`, behavior Isolated), each piece's UTF-8
    bytes are mapped through GPT-2's bytes_to_unicode table and merged by merge rank (the lowest-ranked
    adjacent pair first, every occurrence of it left to right, until no listed pair is adjacent).
`ignore_merges` is false in the files written here, so merge order alone decides the tokens.

Pre-tokenization: with the third-party `regex` module present (it is on the GPU machine) the o200k pattern
is applied as written. Without it, text must be ASCII and an ASCII transcription of the same pattern is used
(\\p{L} -> [A-Za-z], \\p{Lu} -> [A-Z], \\p{Ll} -> [a-z], \\p{Lt}/\\p{Lm}/\\p{Lo}/\\p{M} -> nothing, \\p{N} -> [0-9]);
on ASCII text without control characters other than \\n and \\t both give the same pieces.
"""
import json
import re

O200K_PATTERN = "|".join([
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"\p{N}{1,3}",
    r" ?[^\s\p{L}\p{N}]+[\r\n/]*",
    r"\s*[\r\n]+",
    r"\s+(?!\S)",
    r"\s+",
])

O200K_ASCII_PATTERN = "|".join([
    r"[^\r\nA-Za-z0-9]?[A-Z]*[a-z]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"[^\r\nA-Za-z0-9]?[A-Z]+[a-z]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"[0-9]{1,3}",
    r" ?[^\sA-Za-z0-9]+[\r\n/]*",
    r"\s*[\r\n]+",
    r"\s+(?!\S)",
    r"\s+",
])

HARMONY_SPECIAL_TOKENS = ["<|startoftext|>", "<|endoftext|>", "<|return|>", "<|constrain|>", "<|channel|>",
                          "<|start|>", "<|end|>", "<|message|>", "<|call|>"]


def bytes_to_unicode():
    """GPT-2's reversible byte -> printable character table: printable Latin-1 bytes map to themselves,
    the other bytes to U+0100 upwards in byte order."""
    kept = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\u00a1"), ord("\u00ac") + 1)) + \
        list(range(ord("\u00ae"), ord("\u00ff") + 1))
    table, extra = {}, 0
    for byte in range(256):
        if byte in kept:
            table[byte] = chr(byte)
        else:
            table[byte] = chr(256 + extra)
            extra += 1
    return table


BYTE_TO_CHAR = bytes_to_unicode()
CHAR_TO_BYTE = {c: b for b, c in BYTE_TO_CHAR.items()}


class PreTokenizer:
    def __init__(self):
        try:
            import regex  # noqa: F401 (third-party; present on the GPU machine)
            self._full = regex.compile(O200K_PATTERN)
        except ImportError:
            self._full = None
        self._ascii = re.compile(O200K_ASCII_PATTERN)

    def split(self, text):
        if self._full is not None:
            return self._full.findall(text)
        if not text.isascii():
            raise ValueError("non-ASCII text needs the `regex` module for exact o200k pre-tokenization")
        return self._ascii.findall(text)


def bpe_merge(symbols, ranks):
    """Merges a list of symbols by rank (HF BPE semantics)."""
    while len(symbols) > 1:
        best, best_rank = None, None
        for pair in zip(symbols, symbols[1:]):
            rank = ranks.get(pair)
            if rank is not None and (best_rank is None or rank < best_rank):
                best, best_rank = pair, rank
        if best is None:
            break
        merged, i = [], 0
        while i < len(symbols):
            if i + 1 < len(symbols) and symbols[i] == best[0] and symbols[i + 1] == best[1]:
                merged.append(best[0] + best[1])
                i += 2
            else:
                merged.append(symbols[i])
                i += 1
        symbols = merged
    return symbols


class Tokenizer:
    def __init__(self, vocab, merges, special_tokens):
        """vocab: byte-unicode string -> id; merges: [(a, b)] in rank order; special_tokens: string -> id."""
        self.vocab = vocab
        self.ranks = {tuple(pair): rank for rank, pair in enumerate(merges)}
        self.special = dict(special_tokens)
        self.id_to_token = {i: t for t, i in vocab.items()}
        self.id_to_special = {i: t for t, i in self.special.items()}
        self.pre = PreTokenizer()
        self._cache = {}
        self._special_re = re.compile("|".join(re.escape(t) for t in sorted(self.special, key=len, reverse=True)))

    @classmethod
    def load(cls, path):
        with open(path) as f:
            data = json.load(f)
        model = data["model"]
        if model.get("type") != "BPE":
            raise ValueError(f"{path}: model.type must be BPE")
        merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
        specials = {t["content"]: t["id"] for t in data.get("added_tokens", [])}
        return cls(model["vocab"], merges, specials)

    def vocab_size(self):
        return max(list(self.vocab.values()) + list(self.special.values())) + 1

    def token_id(self, text):
        return self.special[text] if text in self.special else self.vocab[text]

    def _encode_word(self, word):
        ids = self._cache.get(word)
        if ids is None:
            symbols = [BYTE_TO_CHAR[b] for b in word.encode("utf-8")]
            ids = [self.vocab[s] for s in bpe_merge(symbols, self.ranks)]
            self._cache[word] = ids
        return ids

    def encode_ordinary(self, text):
        out = []
        for word in self.pre.split(text):
            out.extend(self._encode_word(word))
        return out

    def encode(self, text, allow_special=True):
        if not allow_special or not self.special:
            return self.encode_ordinary(text)
        out, pos = [], 0
        for match in self._special_re.finditer(text):
            out.extend(self.encode_ordinary(text[pos:match.start()]))
            out.append(self.special[match.group()])
            pos = match.end()
        out.extend(self.encode_ordinary(text[pos:]))
        return out

    def decode_bytes(self, ids):
        out = bytearray()
        for i in ids:
            if i in self.id_to_special:
                out += self.id_to_special[i].encode("utf-8")
            else:
                out += bytes(CHAR_TO_BYTE[c] for c in self.id_to_token[i])
        return bytes(out)

    def decode(self, ids):
        return self.decode_bytes(ids).decode("utf-8", errors="replace")


def tokenizer_json(vocab, merges, special_tokens):
    """The Hugging Face tokenizer.json document (gpt-oss layout)."""
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True} for t, i in special_tokens.items()],
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": O200K_PATTERN}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": [list(m) for m in merges]},
    }
