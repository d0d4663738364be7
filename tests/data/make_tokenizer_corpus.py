"""Generate tests/data/tokenizer_corpus.jsonl: hard strings for tokenizer parity tests.

    python tests/data/make_tokenizer_corpus.py                  # rewrite the corpus (seeded)
    python tests/data/make_tokenizer_corpus.py --unicode-tables # rewrite csrc/bpe.c's class tables

Each line is one JSON string. The corpus is committed; this script records how it was made.

--unicode-tables regenerates the \\p{L} / \\p{N} range tables in csrc/bpe.c. It needs the
`unicodedata2` package at version 16.0.0: Unicode 16.0 is the version whose letter and number
classes the reference tokenizer's regex engine agrees with on every code point (Python 3.11's own
`unicodedata` is 14.0 and misses about 9,000 letters).
"""
import json
import random
import sys
import unicodedata
from pathlib import Path

HERE = Path(__file__).resolve().parent
CORPUS = HERE / "tokenizer_corpus.jsonl"
BPE_C = HERE.parent.parent / "csrc" / "bpe.c"

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|box_end|>",
            "<|vision_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>",
            "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<think>", "</think>"]

WORDS = {
    "latin": ["hello", "world", "The", "quick", "brown", "fox", "naïve", "café", "Straße", "façade",
              "jalapeño", "Ångström", "œuvre", "ĳssel", "Ærø", "ﬁnance", "ſtrong"],
    "cjk": ["你好", "世界", "中文分词", "東京都", "こんにちは", "カタカナ", "漢字テスト", "㐀㐁", "𠀀𠀁𪚥"],
    "arabic": ["مرحبا", "بالعالم", "السَّلَامُ", "عَلَيْكُمْ", "كتاب", "١٢٣٤"],
    "devanagari": ["नमस्ते", "दुनिया", "हिन्दी", "क्षत्रिय", "०१२३"],
    "thai": ["สวัสดี", "ชาวโลก", "ภาษาไทย", "๑๒๓"],
    "cyrillic": ["Привет", "мир", "ЁЖИК", "съешь", "ещё", "Україна", "їжак"],
    "hangul": ["안녕하세요", "세계", "한국어", "각", "ㄱㄴㄷ"],
    "greek": ["Γειά", "σου", "κόσμε", "ΆΈΉ"],
    "hebrew": ["שלום", "עולם", "בְּרֵאשִׁית"],
    "other": ["ሰላም", "გამარჯობა", "Բարեւ", "ꯃꯤꯇꯩ", "𐌰𐌱𐌲", "ᚠᚢᚦ", "ⵜⴰⵎⴰⵣⵉⵖⵜ", "ꦗꦮ"],
}
EMOJI = ["🙂", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇯🇵", "🇺🇳", "1️⃣", "#️⃣", "❤️", "❤", "🧑🏿‍🚀", "👩🏻‍❤️‍💋‍👨🏼",
         "🫠", "🤌🏾", "☺︎", "✌🏼", "🏴󠁧󠁢󠁳󠁣󠁴󠁿", "😀😃😄", "🐍", "🦀"]
SPACES = [" ", "  ", "   ", "\t", "\t\t", "\n", "\n\n", "\r\n", "\r", "\r\r\n", " \n", "\n ",
          "\u00a0", "\u2002", "\u2003", "\u2009", "\u200a", "\u3000", "\u0085", "\u2028", "\u2029",
          "\u202f", "\u205f", "\u1680", "\x0b", "\x0c", "\u200b", "\ufeff", "\x1c", "\x1f", " \t \n"]
CONTRACTIONS = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d"]
CODE = [
    "def f(x):\n    if x > 0:\n        return x ** 2\n    return -x\n",
    "class A:\n\tdef __init__(self):\n\t\tself.a = [1, 2, 3]  # comment\n",
    "#include <stdio.h>\nint main(void) {\n    printf(\"%d\\n\", 42);\n    return 0;\n}\n",
    "fn main() {\n    let v: Vec<u8> = vec![0xFF; 16];\n    println!(\"{:?}\", &v[..]);\n}\n",
    "func main() {\n\tfmt.Println(\"hi\")\n\tfor i := 0; i < 10; i++ {\n\t\tx += i\n\t}\n}\n",
    "const f = async (a, b) => {\n  await g(a?.b ?? 0);\n  return `${a}-${b}`;\n};\n",
    "<html>\n  <body>\n    <div class=\"x\">&nbsp;&lt;tag&gt;</div>\n  </body>\n</html>\n",
    "SELECT id, name FROM users WHERE age >= 18 AND name LIKE '%o''k%';\n",
    "#!/bin/sh\nset -eu\nfor f in *.txt; do\n  echo \"$f\" | tr 'a-z' 'A-Z' >> out.log 2>&1\ndone\n",
    "{\n  \"key\": [1, 2.5e-3, null, true],\n  \"nested\": {\"a\": \"b\"}\n}\n",
    "all: build\n\nbuild:\n\t$(CC) -O2 -o app main.c\n\n.PHONY: all build\n",
    "    x = 1\n        y = 2\n\n\n    z = 3   \n",
    "if (a&&b||!c) { x+=1; y<<=2; z->w = *p++; }\r\n",
    "matrix = [[1,2,3],\n          [4,5,6]]\r\n\r\n",
    "let s = \"don't\" + 'won\\'t' + \"I'LL\";\n",
]
URLS = ["https://example.com/path/to/page?query=1&b=%20x#frag", "http://user:pw@host:8080/a_b-c.d",
        "ftp://ftp.example.org/pub/file.tar.gz", "mailto:someone@example.co.uk",
        "https://zh.wikipedia.org/wiki/中文", "www.example.com/~user/index.html",
        "file:///C:/Users/x/Documents/report(1).pdf", "git@github.com:owner/repo.git",
        "https://xn--n3h.com/🙂?q=✓", "/usr/local/lib/python3.11/site-packages/"]


def pick(rng, seq):
    return seq[rng.randrange(len(seq))]


def any_word(rng):
    return pick(rng, WORDS[pick(rng, sorted(WORDS))])


def random_codepoint(rng):
    """A code point from one of many planes, never a surrogate."""
    plane = pick(rng, [0, 0, 0, 1, 1, 2, 3, 14, 15, 16])
    while True:
        cp = plane * 0x10000 + rng.randrange(0x10000)
        if not 0xD800 <= cp < 0xE000:
            return chr(cp)


def hand_written():
    out = [
        "", " ", "  ", "\n", "\r", "\r\n", "\t", "a", "'", "''", "'s", "x's", "x'S", "x'ſ", "x'ﬅ",
        "x'ß", "don't", "DON'T", "I'm", "I'M", "you're", "YOU'RE", "You'Re", "we've", "WE'VE", "we'vE",
        "she'll", "SHE'LL", "she'Ll", "he'd", "HE'D", "it's", "IT'S", "'sup", "'LLama", "''s", "'s'",
        " 's", "a 's", "a  's", "ſ", "'ſt", "Ǆ'S",
        "hello world", "hello  world", "hello   world", "hello world ", "hello world  ", "  hello",
        "hello\n", "hello\n\n", "hello \nworld", "hello  \n  world", "a\r\nb", "a\rb", "a\r\rb",
        "a\n\r\nb", "a \r\n b", "x\u00a0y", "x \u00a0y", "x\u00a0 y", "x\u3000\u3000y", "x\u2028y",
        "x\x85y", "end   ", "end\t\t", "end \n ", "  \n  \n  ", "\t\n\t\n", " ! ", " !!\n\n", "?!\r\n",
        "(hello)", "((x))", "\"quoted\"", "--flag", "a.b.c", "...", "—dash—", "«guillemets»",
        "1234567890", "3.14159", "1,000,000", "x1y2z3", "٣٤٥", "१२३", "１２３", "²³", "½¾", "ⅫⅣ", "𝟘𝟙𝟚",
        "<|im_start|>user\nhi<|im_end|>", "<|im_start|>system\nYou are helpful.<|im_end|>\n",
        "<|endoftext|>", "<|endoftext|><|endoftext|>", "<|im_start|><|im_end|>", "<<|im_end|>>",
        "<|im_start", "im_start|>", "<|im_end |>", "<tool_call>{\"name\": \"f\"}</tool_call>",
        "<|fim_prefix|>def f():<|fim_suffix|>\n<|fim_middle|>", "<|repo_name|>x<|file_sep|>a.py\n",
        "text<|im_end|>more", " <|im_end|> ", "\n<|im_start|>\n", "<think>\nhmm\n</think>\n\nok",
        "e\u0301", "cafe\u0301", "\u1100\u1161\u11a8", "a\u0328\u0301", "a\u0301\u0328", "\u0041\u030a",
        "\u212b", "\u2126", "\u0344", "ﬃ", "Ａｂｃ", "\u0915\u093c", "\u0958",
    ]
    out.append("x" * 5000)
    out.append(" " * 3000 + "x")
    out.append("9" * 2000)
    out.append("\n" * 500 + "a" + "\r\n" * 300)
    out.append("🙂" * 400)
    out.append("中" * 3000)
    return out


def generate():
    rng = random.Random(20240611)
    corpus = hand_written()

    for script in sorted(WORDS):  # each script alone, and mixed with others
        for _ in range(12):
            sep = pick(rng, [" ", "", ", ", "\n", "  "])
            corpus.append(sep.join(pick(rng, WORDS[script]) for _ in range(rng.randint(1, 8))))
    for _ in range(120):
        parts = [any_word(rng) if rng.random() < 0.7 else pick(rng, EMOJI) for _ in range(rng.randint(2, 12))]
        corpus.append("".join(p + pick(rng, SPACES[:6] + ["", ".", ","]) for p in parts))

    for _ in range(80):  # emoji: ZWJ, skin tones, flags, keycaps, variation selectors
        corpus.append(pick(rng, ["", " "]).join(pick(rng, EMOJI) for _ in range(rng.randint(1, 6))))

    for _ in range(100):  # combining marks, in NFC and NFD and in non-canonical order
        base = " ".join(any_word(rng) for _ in range(rng.randint(1, 5)))
        form = pick(rng, ["NFC", "NFD", "NFKD"])
        s = unicodedata.normalize(form, base)
        if rng.random() < 0.5:
            s += "".join(chr(rng.choice([0x300, 0x301, 0x308, 0x316, 0x323, 0x328, 0x345, 0x5b0, 0x93c,
                                         0x3099, 0x302a, 0x1dc0]))
                         for _ in range(rng.randint(1, 4)))
        corpus.append(s)

    for _ in range(60):  # digits
        digits = "".join(pick(rng, "0123456789") for _ in range(rng.randint(1, 60)))
        corpus.append(pick(rng, ["", "x", " ", "$", "v", "٣"]) + digits + pick(rng, ["", ".5", " apples", "%", "th"]))

    for _ in range(120):  # whitespace runs around words
        corpus.append("".join(pick(rng, SPACES) * rng.randint(1, 4) + pick(rng, ["", any_word(rng), "x", "!", "1", "'s"])
                              for _ in range(rng.randint(1, 6))))

    for _ in range(60):  # contractions in every case
        c = "".join(ch.upper() if rng.random() < 0.5 else ch for ch in pick(rng, CONTRACTIONS))
        corpus.append(pick(rng, ["it", "I", "they", "x", " ", "", "9", "é", "?"]) + c + pick(rng, ["", " go", "x", "'", "!"]))

    for _ in range(60):  # code with indentation
        code = pick(rng, CODE)
        indent = pick(rng, ["", "    ", "\t", "  "])
        corpus.append("".join(indent + line for line in code.splitlines(True)))

    for _ in range(40):
        corpus.append(pick(rng, ["", "see ", "(", "<", "\"", "link: "]) + pick(rng, URLS) + pick(rng, ["", ".", ")", ">", " ok"]))

    for _ in range(60):  # chat transcripts and tool calls with specials inline
        turns = []
        for _ in range(rng.randint(1, 4)):
            role = pick(rng, ["system", "user", "assistant", "tool"])
            body = " ".join(any_word(rng) for _ in range(rng.randint(1, 6)))
            if rng.random() < 0.3:
                body = f"<tool_call>\n{{\"name\": \"{any_word(rng)}\", \"arguments\": {{}}}}\n</tool_call>"
            turns.append(f"<|im_start|>{role}\n{body}<|im_end|>\n")
        s = "".join(turns)
        if rng.random() < 0.3:
            s += pick(rng, SPECIALS) + pick(rng, ["", "x", " ", "\n"])
        corpus.append(s)

    for _ in range(100):  # random bytes, decoded with replacement
        raw = bytes(rng.randrange(256) for _ in range(rng.randint(1, 80)))
        corpus.append(raw.decode("utf-8", errors="replace"))

    for _ in range(150):  # random code points from many planes
        corpus.append("".join(random_codepoint(rng) for _ in range(rng.randint(1, 40))))

    pieces = [any_word, lambda r: pick(r, EMOJI), lambda r: pick(r, SPACES), lambda r: pick(r, SPECIALS),
              lambda r: pick(r, URLS), lambda r: pick(r, CONTRACTIONS), random_codepoint,
              lambda r: str(r.randrange(10 ** 6)), lambda r: pick(r, "()[]{}<>.,;:!?'\"-_/\\|@#$%^&*~`")]
    for _ in range(100):  # a bit of everything
        corpus.append("".join(pick(rng, pieces)(rng) for _ in range(rng.randint(1, 30))))

    long_parts = []  # one string of about 100 KB
    while sum(len(p) for p in long_parts) < 100_000:
        long_parts.append(pick(rng, pieces)(rng) if rng.random() < 0.5 else pick(rng, CODE))
    corpus.append("".join(long_parts))
    return corpus


def write_corpus():
    corpus = generate()
    with open(CORPUS, "w", encoding="utf-8", newline="\n") as f:
        for s in corpus:
            f.write(json.dumps(s, ensure_ascii=False) + "\n")
    print(f"{CORPUS}: {len(corpus)} strings, {CORPUS.stat().st_size} bytes")


def class_ranges(unicodedata_module, major):
    """[start, end] ranges of code points whose general category starts with `major`."""
    out, start = [], None
    for cp in range(0x110001):
        inside = cp < 0x110000 and unicodedata_module.category(chr(cp))[0] == major
        if inside and start is None:
            start = cp
        elif not inside and start is not None:
            out.append((start, cp - 1))
            start = None
    return out


def c_table(name, ranges):
    lines = [f"static const uint32_t {name}[][2] = {{"]
    for i in range(0, len(ranges), 6):
        lines.append("    " + " ".join(f"{{0x{a:X}, 0x{b:X}}}," for a, b in ranges[i:i + 6]))
    lines.append("};")
    return "\n".join(lines)


def write_unicode_tables():
    import unicodedata2  # the version pin matters: see the module docstring

    if unicodedata2.unidata_version != "16.0.0":
        sys.exit(f"need unicodedata2 16.0.0 (Unicode 16.0), found {unicodedata2.unidata_version}")
    begin, end = "/* BEGIN GENERATED UNICODE TABLES */\n", "/* END GENERATED UNICODE TABLES */"
    src = BPE_C.read_text()
    head, rest = src.split(begin)
    _, tail = rest.split(end)
    tables = "\n".join([c_table("letter_ranges", class_ranges(unicodedata2, "L")),
                        c_table("number_ranges", class_ranges(unicodedata2, "N"))])
    BPE_C.write_text(head + begin + tables + "\n" + end + tail)
    print(f"{BPE_C}: tables rewritten from Unicode {unicodedata2.unidata_version}")


if __name__ == "__main__":
    if "--unicode-tables" in sys.argv[1:]:
        write_unicode_tables()
    else:
        write_corpus()
