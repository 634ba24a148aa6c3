"""Make an Engram lookup trace from real text, the way the reference trace give.* (the workspace's
shared/traces/, beside this repository) was made.

A trace is what one Engram layer of a serving engine would look up: documents from this machine
(Rust documentation, man pages, the Python standard library) become requests, a byte-level BPE
tokenizer and the Engram tokenizer compression turn them into compressed token ids, the Engram
n-gram hash turns every token into 16 row ids of one table, and a continuous-batching scheduler
orders the tokens into steps. It writes, under --out:

  NAME.u64        little-endian u64 row ids, one per lookup, in step order
  NAME.steps.u32  per step, a little-endian u32 pair (decode tokens, prefill tokens)
  NAME.docs.json  the requests in arrival order: file, origin, source, prompt/output tokens,
                  and first_token (where the request starts in the document's tokens)
  NAME.json       how it was made, in the shape of give.json
  NAME.u64.xz     with --xz

The hash table (primes, offsets, multipliers) is read from the reference's give.json, so row ids
of different traces index the same table. The documents differ from the reference's: the split
salt is ours, and so is the tokenizer, trained on our own tok split. What give.json leaves
unsaid (when a finished request's place frees, where the trace stops, where a request sits in
its document, how the tokenizer was trained, how man pages became text) follows what the
reference's own files show; benches/traces/README.md says how.

Needs numpy and HF tokenizers, e.g.:
  python3 -m venv /tmp/tracevenv && /tmp/tracevenv/bin/pip install tokenizers numpy
  /tmp/tracevenv/bin/python benches/traces/make_trace.py --out /tmp/traces --name t2 --seed 2
"""

import argparse
import collections
import concurrent.futures
import dataclasses
import gzip
import hashlib
import html.parser
import json
import lzma
import math
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

RUST_HTML = Path("/root/.rustup/toolchains/1.95.0-x86_64-unknown-linux-gnu/share/doc/rust/html")
RUST_BOOKS = (
    "book", "reference", "rust-by-example", "nomicon", "cargo", "edition-guide",
    "embedded-book", "rustc", "rustdoc", "style-guide", "unstable-book", "error_codes",
)
MAN_ROOT = Path("/usr/share/man")
PYSTD_ROOT = Path("/root/.pyenv/versions/3.11.7/lib/python3.11")
# The reference trace's description, beside the repository (its engram section: the table).
REFERENCE_JSON = Path(__file__).resolve().parents[3] / "shared" / "traces" / "give.json"
RUST_SKIPPED_DIRS = {  # translations, and the book's old editions (pages saying it moved)
    "rust-by-example/es", "rust-by-example/ja", "rust-by-example/ko", "rust-by-example/zh",
    "book/first-edition", "book/second-edition", "book/2018-edition",
}
RUST_SKIPPED_PAGES = {"print.html", "toc.html", "404.html"}  # a whole book again, or no text
PYSTD_SKIP_DIRS = {"test", "tests", "idlelib", "site-packages", "__pycache__"}
SOURCES = ("rustdoc", "man", "pystd")
SPLITS = ("tok", "give", "keep")
MIN_TEXT_CHARS = 200
GENERATOR = "benches/traces/make_trace.py"

START = time.monotonic()


def log(message):
    """Progress to stderr, with the seconds since the start."""
    print(f"[{time.monotonic() - START:6.1f}s] {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# Corpus: documents, their text, and their split


@dataclasses.dataclass
class Document:
    """One document of a source; its text is read (or rendered) only when asked for."""

    source: str
    origin: str  # where it came from, as the reference's docs file names it
    path: Path
    key_digest: bytes = b""  # sha256 of what its split is hashed from; orders the tok sample
    split: str = ""
    index: int = 0  # place among its source's documents of its split, sorted by origin
    _text: str | None = None

    def text(self):
        if self._text is None:
            self._text = TEXT_READERS[self.source](self.path)
        return self._text


class MainText(html.parser.HTMLParser):
    """The text of an HTML page's <main> element, without scripts and styles: its text as the
    page's source has it (line breaks included), with a line break at each block's ends."""

    BLOCKS = {
        "p", "div", "pre", "br", "li", "ul", "ol", "dl", "dt", "dd", "tr", "table", "section",
        "blockquote", "h1", "h2", "h3", "h4", "h5", "h6", "hr", "header", "footer", "details",
        "summary", "figure", "figcaption", "nav", "main",
    }
    SKIPPED = {"script", "style"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.main_depth = 0
        self.skip_depth = 0
        self.parts = []
        self.saw_main = False

    def handle_starttag(self, tag, attrs):
        if tag == "main":
            self.main_depth += 1
            self.saw_main = True
        if not self.main_depth:
            return
        if tag in self.SKIPPED:
            self.skip_depth += 1
        if tag in self.BLOCKS:
            self.parts.append("\n")

    def handle_endtag(self, tag):
        if not self.main_depth:
            return
        if tag in self.SKIPPED and self.skip_depth:
            self.skip_depth -= 1
        if tag in self.BLOCKS:
            self.parts.append("\n")
        if tag == "main":
            self.main_depth -= 1

    def handle_data(self, data):
        if self.main_depth and not self.skip_depth:
            self.parts.append(data)

    def text(self):
        return "".join(self.parts)


def collapse_blank_lines(text):
    """Trailing spaces off every line, runs of blank lines down to one, no blank ends."""
    lines = [line.rstrip() for line in text.splitlines()]
    out = []
    for line in lines:
        if line or (out and out[-1]):
            out.append(line)
    return "\n".join(out).strip("\n") + "\n"


def read_rustdoc(path):
    parser = MainText()
    parser.feed(path.read_text(encoding="utf-8", errors="replace"))
    parser.close()
    if not parser.saw_main:
        return ""
    return collapse_blank_lines(parser.text())


# Requests and macros whose arguments are layout, not text: a line of one of them is dropped.
TROFF_LAYOUT = {
    "TH", "PP", "LP", "P", "TP", "TQ", "HP", "RS", "RE", "PD", "br", "sp", "nf", "fi", "in",
    "ti", "ne", "ad", "na", "hy", "nh", "ft", "ps", "vs", "ll", "ta", "bp", "EX", "EE", "TS",
    "TE", "T&", "so", "ds", "nr", "if", "ie", "el", "tr", "cc", "c2", "ec", "eo", "lf", "mso",
    "rm", "rn", "als", "ev", "fam", "ss", "cs", "fp", "pl", "po", "ns", "rs", "sy", "tm", "do",
    "UC", "DT", "Dd", "Dt", "Os", "Bl", "El", "Bd", "Ed", "Pp", "Lp", "ME", "UE", "YS",
}
# Blocks up to a line ".." (or "." and the end name given): macro definitions, and comments;
# the value is the place of the end name among the request's arguments.
TROFF_BLOCKS = {"de": 1, "de1": 1, "am": 1, "ig": 0}
TROFF_GLYPHS = {
    "-": "-", "hy": "-", "mi": "-", "en": "-", "em": "--", "aq": "'", "dq": '"', "lq": '"',
    "rq": '"', "oq": "'", "cq": "'", "bu": "*", "co": "(C)", "rg": "(R)", "tm": "(TM)",
    "ti": "~", "ha": "^", "ga": "`", "ul": "_", "rs": "\\", "sl": "/", "pl": "+", "eq": "=",
    "<=": "<=", ">=": ">=", "->": "->", "<-": "<-", "mu": "x", "de": "deg", "Fo": "<<",
    "Fc": ">>", "fo": "<", "fc": ">", "ba": "|", "or": "|", "bv": "|", "at": "@", "sh": "#",
    "Do": "$", "lB": "[", "rB": "]", "lC": "{", "rC": "}", "ss": "ss", "ae": "ae", "ct": "c",
}
TROFF_ESCAPE = re.compile(
    r"\\(?:"
    r"\((?P<glyph2>..)|\[(?P<glyph>[^]\s]*)\]"  # named glyphs
    r"|\*(?:\(..|\[[^]]*\]|.)"  # string interpolation
    r"|[fFgkmMnVY](?:\(..|\[[^]]*\]|.)"  # font, register, colour
    r"|s[-+]?(?:\(\d\d|\[[^]]*\]|\d)"  # size
    r"|[hvwlLNoxXbBDRSAZ](?:'[^']*'|\[[^]]*\])"  # motions, widths, drawing
    r"|(?P<char>.)"  # one character
    r")"
)
TROFF_CHAR = {"-": "-", "e": "\\", "\\": "\\", " ": " ", "~": " ", "0": " ", "t": "\t",
              "'": "'", "`": "`", ".": ".", "_": "_", "[": "[", "]": "]"}


def troff_unescape(line):
    """A troff text line with its escapes as plain characters (or nothing)."""
    def one(match):
        glyph = match.group("glyph2") or match.group("glyph")
        if glyph is not None:
            return TROFF_GLYPHS.get(glyph, "")
        char = match.group("char")
        return TROFF_CHAR.get(char, "") if char is not None else ""
    return TROFF_ESCAPE.sub(one, line.split('\\"', 1)[0])


def macro_words(line):
    """A macro line's name and its arguments, double quotes grouping."""
    words = re.findall(r'"((?:[^"]|"")*)"?|(\S+)', line[1:])
    args = [quoted.replace('""', '"') if quoted or not bare else bare for quoted, bare in words]
    return (args[0], args[1:]) if args else ("", [])


def strip_troff(source):
    """The text of a man page's troff source: text lines with their escapes resolved; a macro
    line's arguments joined by spaces (its name dropped), or nothing for a layout request;
    comments, the title line, macro definitions and table formats dropped."""
    out = []
    block_end = None
    table_format = False
    for line in source.splitlines():
        if block_end is not None:
            block_end = None if line.strip() == block_end else block_end
            continue
        if table_format:
            table_format = not line.rstrip().endswith(".")
            continue
        if line.startswith((".", "'")):
            name, args = macro_words(troff_unescape(line) if "\\" in line else line)
            if name in TROFF_BLOCKS:
                at = TROFF_BLOCKS[name]
                block_end = "." + args[at] if len(args) > at else ".."
            elif name == "TS":
                table_format = True
            elif name == "IP":
                out.append(args[0] if args else "")
            elif name not in TROFF_LAYOUT and not name.startswith("\\") and args:
                out.append(" ".join(a for a in args if a))
            continue
        if line.strip() in ("T{", "T}") or line.startswith('\\"'):
            continue
        out.append(troff_unescape(line.replace("T{", "").replace("T}", "")))
    return "\n".join(out)


def render_groff(source):
    """The page as groff renders it for a terminal, as plain text ("" where it fails)."""
    try:
        run = subprocess.run(
            ["groff", "-mandoc", "-t", "-Tutf8", "-P", "-c", "-P", "-b", "-P", "-u"],
            input=source, capture_output=True, cwd=MAN_ROOT, timeout=60,
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    return run.stdout.decode("utf-8", errors="replace")


def read_man_stripped(path):
    """A man page's text from its troff source (what the reference's lengths match)."""
    source = gzip.decompress(path.read_bytes()).decode("utf-8", errors="replace")
    return collapse_blank_lines(strip_troff(source))


def read_man_groff(path):
    """A man page as groff lays it out for a terminal; stripped where groff gives nothing."""
    text = render_groff(gzip.decompress(path.read_bytes()))
    return collapse_blank_lines(text) if len(text.strip()) >= MIN_TEXT_CHARS \
        else read_man_stripped(path)


MAN_READERS = {"strip": read_man_stripped, "groff": read_man_groff}
MAN_TEXT_DESCRIPTION = {
    "strip": "troff stripped (text lines unescaped, macro arguments joined by spaces, layout "
             "requests, comments and the title line dropped)",
    "groff": "rendered by groff -mandoc -t -Tutf8 as plain text",
}


def read_pystd(path):
    return path.read_text(encoding="utf-8", errors="replace")


# How each source's documents become text; main sets the man reader from --man-text.
TEXT_READERS = {"rustdoc": read_rustdoc, "man": read_man_stripped, "pystd": read_pystd}


def rustdoc_documents():
    """The English pages of each book, without whole-book pages and old-edition stubs."""
    for book in RUST_BOOKS:
        for path in sorted((RUST_HTML / book).rglob("*.html")):
            rel = path.relative_to(RUST_HTML)
            if path.name in RUST_SKIPPED_PAGES or "/".join(rel.parts[:2]) in RUST_SKIPPED_DIRS:
                continue
            origin = "rust-1.95.0/share/doc/rust/html/" + str(path.relative_to(RUST_HTML))
            yield Document("rustdoc", origin, path)


def is_so_stub(troff):
    """A man page that only includes another (`.so man3/other.3`)."""
    lines = [l for l in troff.splitlines() if l.strip() and not l.startswith(('.\\"', "'\\\""))]
    return bool(lines) and all(l.startswith(".so ") for l in lines)


def man_documents():
    """Every English man page that is a file of its own (no symlinks, no `.so` stubs)."""
    for section in range(1, 9):
        for path in sorted((MAN_ROOT / f"man{section}").glob("*.gz")):
            if path.name.startswith("gcloud") or path.is_symlink():
                continue
            yield Document("man", f"man/man{section}/{path.name}", path)


def pystd_documents():
    for path in sorted(PYSTD_ROOT.rglob("*.py")):
        rel = path.relative_to(PYSTD_ROOT)
        if PYSTD_SKIP_DIRS & set(rel.parts[:-1]):
            continue
        yield Document("pystd", "cpython-3.11.7/lib/python3.11/" + str(rel), path)


def split_of(salt, key):
    """sha256(salt || 0 || key) mod 100: below 20 tok, below 60 give, else keep."""
    bucket = int.from_bytes(hashlib.sha256(salt + b"\x00" + key).digest(), "big") % 100
    return "tok" if bucket < 20 else "give" if bucket < 60 else "keep"


def split_key(doc):
    """The text for rustdoc and pystd (cheap to read); for man pages, the troff source, so that
    only the pages a trace or the tokenizer uses need rendering. None: a document to skip."""
    if doc.source == "man":
        troff = gzip.decompress(doc.path.read_bytes())
        return None if is_so_stub(troff.decode("utf-8", "replace")) else troff
    text = doc.text()
    return text.encode("utf-8") if len(text) >= MIN_TEXT_CHARS else None


def read_corpus(salt):
    """Each source's documents by split, sorted by origin, with their index in that list."""
    listers = {"rustdoc": rustdoc_documents, "man": man_documents, "pystd": pystd_documents}
    corpus = {split: {} for split in SPLITS}
    for source in SOURCES:
        by_split = {split: [] for split in SPLITS}
        for doc in listers[source]():
            key = split_key(doc)
            if key is None:
                continue
            doc.split = split_of(salt, key)
            doc.key_digest = hashlib.sha256(key).digest()
            by_split[doc.split].append(doc)
        for split, docs in by_split.items():
            for i, doc in enumerate(docs):
                doc.index = i
            corpus[split][source] = docs
        log(f"{source}: " + ", ".join(f"{len(by_split[s])} {s}" for s in SPLITS))
    return corpus


def doc_file(doc):
    return f"{doc.split}/{doc.source}/{doc.index:05d}.txt"


# ---------------------------------------------------------------------------------------------
# Tokenizer: byte-level BPE, and the Engram compression of its ids


def tokenizer_sample(corpus, docs_per_source):
    """The tok split's documents the tokenizer trains on: per source, the first
    docs_per_source by key digest (all of them with 0)."""
    sample = []
    for source in SOURCES:
        docs = sorted(corpus["tok"][source], key=lambda d: d.key_digest)
        sample += docs[:docs_per_source] if docs_per_source else docs
    return sample


def render_all(docs, workers=4):
    """Read (render) the texts of docs, several man pages at a time."""
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        list(pool.map(Document.text, docs))


END_OF_TEXT = "<|endoftext|>"
TOKENIZER_RECIPE = "byte-level BPE, GPT-2 pre-tokenizer, trained on lines, <|endoftext|> first"


def lines_with_endings(text):
    """The text's lines, each with its newline: what the BPE trainer sees, as it does when it
    trains from files (so no token joins a newline to what follows it)."""
    lines = text.split("\n")
    return [line + "\n" for line in lines[:-1]] + ([lines[-1]] if lines[-1] else [])


def new_bpe():
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    bpe.decoder = decoders.ByteLevel()
    return bpe


def train_tokenizer(corpus, args):
    """The BPE tokenizer for the tok split's texts and this vocabulary, trained once and kept
    in the cache folder under a hash of both."""
    sample = tokenizer_sample(corpus, args.tok_docs)
    render_all(sample)
    texts = [d.text() for d in sample]
    tag = hashlib.sha256(
        f"{TOKENIZER_RECIPE}\x00{args.vocab}\x00".encode()
        + b"".join(hashlib.sha256(t.encode("utf-8")).digest() for t in texts)
    ).hexdigest()[:16]
    cached = args.cache / f"bpe-{tag}.json"
    training = {"documents": len(sample),
                "by_source": dict(collections.Counter(d.source for d in sample)),
                "chars": sum(map(len, texts)), "unit": "line"}
    if cached.exists():
        log(f"tokenizer: reusing {cached}")
        return Tokenizer.from_file(str(cached)), cached, training
    lines = [line for text in texts for line in lines_with_endings(text)]
    log(f"tokenizer: training on {len(texts)} tok documents, {training['chars']:,} chars, "
        f"{len(lines):,} lines")
    bpe = new_bpe()
    trainer = trainers.BpeTrainer(
        vocab_size=args.vocab, special_tokens=[END_OF_TEXT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    bpe.train_from_iterator(lines, trainer=trainer, length=len(lines))
    args.cache.mkdir(parents=True, exist_ok=True)
    bpe.save(str(cached))
    log(f"tokenizer: trained, vocab {bpe.get_vocab_size()}, saved {cached}")
    return bpe, cached, training


ENGRAM_SPACE = "\ue000"  # stands for a lone space through the strip, as engram_demo_v1 does


def engram_normalizer():
    """NFKC, NFD, strip accents, lowercase, whitespace runs to one space, strip; a token that
    is only whitespace normalizes to a single space."""
    return normalizers.Sequence([
        normalizers.NFKC(),
        normalizers.NFD(),
        normalizers.StripAccents(),
        normalizers.Lowercase(),
        normalizers.Replace(Regex(r"[ \t\r\n]+"), " "),
        normalizers.Replace(Regex(r"^ $"), ENGRAM_SPACE),
        normalizers.Strip(),
        normalizers.Replace(ENGRAM_SPACE, " "),
    ])


def compression_table(bpe):
    """Compressed id of every BPE id: one per distinct normalized token text, from 1 in BPE id
    order; 0 is the pad. A token decoding to a partial UTF-8 sequence keeps its own BPE name."""
    normalize = engram_normalizer().normalize_str
    compressed = {}
    table = np.zeros(bpe.get_vocab_size(), dtype=np.int64)
    for tid in range(bpe.get_vocab_size()):
        text = bpe.decode([tid], skip_special_tokens=False)
        if "\ufffd" in text:
            key = bpe.id_to_token(tid)
        else:
            key = normalize(text) or text
        table[tid] = compressed.setdefault(key, len(compressed) + 1)
    return table


# ---------------------------------------------------------------------------------------------
# Engram hashing


@dataclasses.dataclass
class EngramHash:
    """The n-gram hash of one Engram layer: per column, an n-gram order, a prime, an offset."""

    multipliers: np.ndarray
    orders: np.ndarray
    primes: np.ndarray
    offsets: np.ndarray
    section: dict  # the engram section it was read from, for the trace's description

    @classmethod
    def from_description(cls, path):
        section = json.loads(Path(path).read_text())["engram"]
        columns = section["columns"]
        return cls(
            multipliers=np.array(section["multipliers"], dtype=np.int64),
            orders=np.array([c["order"] for c in columns], dtype=np.int64),
            primes=np.array([c["prime"] for c in columns], dtype=np.int64),
            offsets=np.array([c["offset"] for c in columns], dtype=np.int64),
            section=section,
        )

    @property
    def ids_per_token(self):
        return len(self.primes)

    def check_no_overflow(self, max_compressed_id):
        bound = max_compressed_id * int(self.multipliers.max())
        if bound >= 2**63:
            sys.exit(f"compressed ids up to {max_compressed_id} overflow the int64 hash mix; "
                     "use a smaller --vocab")

    def rows(self, compressed):
        """Row ids, shape (tokens, columns), of a sequence of compressed ids; positions before
        its start are the pad, 0."""
        tokens = len(compressed)
        max_order = int(self.orders.max())
        padded = np.concatenate([np.zeros(max_order - 1, dtype=np.int64), compressed])
        mixes = {}
        mix = np.zeros(tokens, dtype=np.int64)
        for k in range(max_order):
            back = padded[max_order - 1 - k: max_order - 1 - k + tokens]
            mix = mix ^ (back * self.multipliers[k])
            mixes[k + 1] = mix
        per_column = np.stack([mixes[int(n)] for n in self.orders], axis=1)
        return (self.offsets + per_column % self.primes).astype(np.uint64)


# ---------------------------------------------------------------------------------------------
# Requests


@dataclasses.dataclass
class Request:
    doc: Document
    first_token: int  # where in the document's tokens the request starts
    prompt_tokens: int
    output_tokens: int
    rows: np.ndarray  # (prompt + output, columns) row ids

    def description(self):
        return {"file": doc_file(self.doc), "origin": self.doc.origin, "source": self.doc.source,
                "prompt_tokens": self.prompt_tokens, "output_tokens": self.output_tokens,
                "first_token": self.first_token}


def parse_mix(text):
    mix = {}
    for part in text.split(","):
        source, _, weight = part.partition("=")
        if source not in SOURCES:
            raise argparse.ArgumentTypeError(f"unknown source {source!r}; want {SOURCES}")
        mix[source] = float(weight)
    if sum(mix.values()) <= 0:
        raise argparse.ArgumentTypeError("the mix's weights sum to zero")
    return mix


def lognormal_length(rng, median, sigma, cap):
    return int(min(cap, max(1, round(math.exp(math.log(median) + sigma * rng.standard_normal())))))


def window_lengths(rng, prompt_draw, output_draw, doc_tokens):
    """(first token, prompt, output) of a request as the reference's requests show: a window
    of prompt + output tokens at a uniformly drawn place in a longer document; a shorter
    document whole, its tokens shared between prompt and output in the drawn proportion (so no
    request is without output, and log(output / prompt) keeps the draws' spread)."""
    total = prompt_draw + output_draw
    if total <= doc_tokens:
        return int(rng.integers(doc_tokens - total + 1)), prompt_draw, output_draw
    prompt = min(doc_tokens, max(1, round(doc_tokens * prompt_draw / total)))
    return 0, prompt, doc_tokens - prompt


def prompt_first_lengths(rng, prompt_draw, output_draw, doc_tokens):
    """(first token, prompt, output): the document's first min(prompt draw, tokens) tokens,
    then the next min(output draw, rest) (none where the prompt takes the whole document)."""
    prompt = min(prompt_draw, doc_tokens)
    return 0, prompt, min(output_draw, doc_tokens - prompt)


LENGTH_RULES = {"window": window_lengths, "prompt-first": prompt_first_lengths}
LENGTH_RULE_TEXT = {
    "window": "prompt + output tokens from a uniformly drawn first token of a longer document; "
              "a shorter document whole, shared between prompt and output in the drawn "
              "proportion",
    "prompt-first": "the prompt is the document's first min(prompt draw, tokens) tokens, the "
                    "output the next min(output draw, rest)",
}


def make_requests(corpus, args, bpe, table, engram):
    """--requests requests in arrival order: each from a document of --split drawn without
    replacement, its source drawn by --mix, its prompt and output lengths by the lognormals,
    placed in the document by --length-rule."""
    rng = np.random.default_rng(args.seed)
    sources = list(args.mix)
    weights = np.array([args.mix[s] for s in sources]) / sum(args.mix.values())
    pools = {s: list(corpus[args.split][s]) for s in sources}
    requests = []
    while len(requests) < args.requests:
        source = sources[rng.choice(len(sources), p=weights)]
        pool = pools[source]
        if not pool:
            sys.exit(f"the {args.split} split has too few {source} documents")
        doc = pool.pop(int(rng.integers(len(pool))))
        draws = (lognormal_length(rng, *args.prompt_lognormal),
                 lognormal_length(rng, *args.output_lognormal))
        if len(doc.text()) < MIN_TEXT_CHARS:
            continue  # a man page that renders to almost nothing
        ids = np.array(bpe.encode(doc.text()).ids, dtype=np.int64)
        first, prompt, output = LENGTH_RULES[args.length_rule](rng, *draws, len(ids))
        if prompt == 0:
            continue
        compressed = table[ids[first: first + prompt + output]]
        requests.append(Request(doc, first, prompt, output, engram.rows(compressed)))
        if len(requests) % 50 == 0:
            log(f"requests: {len(requests)}")
    return requests


# ---------------------------------------------------------------------------------------------
# Scheduler


@dataclasses.dataclass
class Running:
    request: int
    prefilled: int = 0
    decoded: int = 0


def schedule(requests, max_seqs, step_tokens, drain):
    """Continuous batching with chunked prefill, all requests queued at the start in arrival
    order. Each step: one decode token for every running request whose prompt is prefilled and
    whose output is not complete (in arrival order), then prefill from the remaining budget,
    first come first served, admitting queued requests while fewer than max_seqs run. A request
    finishes with its last output token (its last prompt token without output) and frees its
    place at the end of that step. Returns per step a list of (request, first token, end token)
    spans in the step's order, decode tokens first. Without drain, stops before the step that
    would empty the queue, so that every step is one of a busy engine (the reference's rule)."""
    if max_seqs > step_tokens:
        sys.exit("--max-seqs above --step-tokens leaves no budget for prefill")
    queue = collections.deque(range(len(requests)))
    running = []
    steps = []
    while queue or running:
        spans = []
        for r in running:
            req = requests[r.request]
            if r.prefilled == req.prompt_tokens and r.decoded < req.output_tokens:
                at = req.prompt_tokens + r.decoded
                spans.append((r.request, at, at + 1))
                r.decoded += 1
        budget = step_tokens - len(spans)
        while budget > 0:
            filling = next((r for r in running
                            if r.prefilled < requests[r.request].prompt_tokens), None)
            if filling is None:
                if not queue or len(running) >= max_seqs:
                    break
                filling = Running(queue.popleft())
                running.append(filling)
            n = min(budget, requests[filling.request].prompt_tokens - filling.prefilled)
            spans.append((filling.request, filling.prefilled, filling.prefilled + n))
            filling.prefilled += n
            budget -= n
        if not drain and not queue:
            break
        running = [r for r in running
                   if r.prefilled < requests[r.request].prompt_tokens
                   or r.decoded < requests[r.request].output_tokens]
        steps.append(spans)
    return steps


def step_counts(steps, requests):
    """(decode tokens, prefill tokens) of each step."""
    counts = np.zeros((len(steps), 2), dtype=np.uint32)
    for t, spans in enumerate(steps):
        for r, start, end in spans:
            counts[t, 0 if start >= requests[r].prompt_tokens else 1] += end - start
    return counts


def trace_ids(steps, requests):
    """All steps' row ids, concatenated."""
    parts = [requests[r].rows[start:end].reshape(-1) for spans in steps for r, start, end in spans]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint64)


# ---------------------------------------------------------------------------------------------
# Check: the steps as host/store/requests.rs rebuilds them from the documents file


def rebuild_spans(counts, lengths):
    """Per step, (request, first token, end token) spans as requests.rs's step_requests assigns
    the step's decode and prefill tokens, from the (prompt, output) lengths alone."""
    prompt_left = [p for p, _ in lengths]
    output_left = [o for _, o in lengths]
    decoding = []
    next_r = 0
    out = []
    for t, (decode, prefill) in enumerate(counts.tolist()):
        spans = []
        while next_r < len(lengths) and prompt_left[next_r] == 0:
            if lengths[next_r][0] == 0 and output_left[next_r] > 0:
                decoding.append(next_r)
            next_r += 1
        if len(decoding) < decode:
            raise ValueError(f"step {t}: {decode} decode tokens, {len(decoding)} decoding")
        for r in decoding[:decode]:
            at = sum(lengths[r]) - output_left[r]
            spans.append((r, at, at + 1))
            output_left[r] -= 1
        decoding = [r for r in decoding if output_left[r] > 0]
        while prefill > 0:
            while next_r < len(lengths) and prompt_left[next_r] == 0:
                next_r += 1
            if next_r == len(lengths):
                raise ValueError(f"step {t}: prefill runs past the prompts")
            n = min(prefill, prompt_left[next_r])
            at = lengths[next_r][0] - prompt_left[next_r]
            spans.append((next_r, at, at + n))
            prefill -= n
            prompt_left[next_r] -= n
            if prompt_left[next_r] == 0 and output_left[next_r] > 0:
                decoding.append(next_r)
        out.append(spans)
    return out


def check_trace(counts, docs, ids, requests, ids_per_token):
    """Rebuilds the steps from the written docs as requests.rs does and checks the ids they
    name, token by token, against the trace."""
    lengths = [(d["prompt_tokens"], d["output_tokens"]) for d in docs]
    spans = rebuild_spans(counts, lengths)
    tokens = int(counts.sum())
    if len(ids) != ids_per_token * tokens:
        raise ValueError(f"{len(ids)} ids for {tokens} tokens")
    if not np.array_equal(trace_ids(spans, requests), ids):
        raise ValueError("the ids rebuilt from the documents differ from the trace")
    log(f"check: {len(spans)} steps rebuilt from the documents as requests.rs does; "
        f"{tokens} tokens, {len(ids)} ids, all equal")


# ---------------------------------------------------------------------------------------------
# Summary and output


def first_asks(ids, counts, ids_per_token, rows_r):
    """The rows each step asks for, once a step (step-major), as step * R + row."""
    per_step = counts.sum(axis=1).astype(np.int64) * ids_per_token
    step_of = np.repeat(np.arange(len(counts), dtype=np.uint64), per_step)
    return np.unique(step_of * np.uint64(rows_r) + ids)


def full_prefill_rows(firsts, counts, step_tokens, rows_r):
    """Median distinct rows of a step that is all prefill and full (NaN without one)."""
    per_step = np.bincount((firsts // np.uint64(rows_r)).astype(np.int64), minlength=len(counts))
    full = (counts[:, 0] == 0) & (counts[:, 1] == step_tokens)
    return float(np.median(per_step[full])) if full.any() else float("nan")


def zipf_slope(ids):
    """-slope of log(count) against log(rank) at 200 log-spaced ranks (0.735 on give.u64)."""
    _, count = np.unique(ids, return_counts=True)
    count = np.sort(count)[::-1]
    if len(count) < 2:
        return float("nan")
    ranks = np.unique(np.geomspace(1, len(count), 200).astype(np.int64))
    return float(-np.polyfit(np.log(ranks), np.log(count[ranks - 1]), 1)[0])


def sha256_file(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_xz(path):
    with open(path, "rb") as src, lzma.open(str(path) + ".xz", "wb", preset=6) as dst:
        for block in iter(lambda: src.read(1 << 20), b""):
            dst.write(block)


def description(args, salt, ids, counts, requests, engram, bpe_path, bpe, table, training):
    name = args.name
    prompt_in_trace = int(counts[:, 1].sum())
    output_in_trace = int(counts[:, 0].sum())
    return {
        "format": "little-endian u64 row ids, one per lookup, step order; ids of a token are "
                  "consecutive in hash-column order",
        "file": f"{name}.u64",
        "bytes": int(ids.nbytes),
        "sha256": sha256_file(args.out / f"{name}.u64"),
        "lookups": int(len(ids)),
        "distinct_rows": int(len(np.unique(ids))),
        "corpus": {
            "split": args.split,
            "split_rule": "sha256(salt || 0 || text) mod 100: <20 tok, <60 give, else keep; "
                          "text is the troff source for man pages",
            "split_salt": args.salt,
            "split_salt_sha256": hashlib.sha256(salt).hexdigest(),
            "sources": {
                "rustdoc": "Rust 1.95.0 toolchain docs, mdBook HTML <main> text ("
                           + ", ".join(RUST_BOOKS) + "), English pages of at least "
                           f"{MIN_TEXT_CHARS} chars, no print/toc/404 pages nor the book's "
                           "old-edition stubs; MIT OR Apache-2.0",
                "man": "English man pages /usr/share/man/man[1-8] minus gcloud*, symlinks and "
                       ".so stubs, " + MAN_TEXT_DESCRIPTION[args.man_text]
                       + "; licenses per package (/usr/share/doc/<pkg>/copyright)",
                "pystd": "CPython 3.11.7 standard library *.py, no tests, no idlelib, of at "
                         f"least {MIN_TEXT_CHARS} chars; PSF-2.0",
            },
            "mix": {s: str(w) for s, w in args.mix.items()},
            "requests": len(requests),
            "requests_by_source": dict(collections.Counter(r.doc.source for r in requests)),
            "documents_file": f"{name}.docs.json",
        },
        "tokenizer": {
            "type": "byte-level BPE (HF tokenizers, GPT-2 pre-tokenizer) trained on the tok "
                    "split's lines, special token " + END_OF_TEXT + (f" (at most {args.tok_docs} documents a source)"
                               if args.tok_docs else ""),
            "trained_on": training,
            "vocab": bpe.get_vocab_size(),
            "engram_compressed_vocab": int(table.max()) + 1,
            "compression": "engram_demo_v1 CompressedTokenizer normalizer (NFKC, NFD, "
                           "StripAccents, Lowercase, whitespace collapse, Strip)",
            "sha256_bpe_json": sha256_file(bpe_path),
            "pad_compressed_id": 0,
        },
        "tokens": prompt_in_trace + output_in_trace,
        "prompt_tokens": prompt_in_trace,
        "output_tokens": output_in_trace,
        "engram": engram.section,
        "scheduler": {
            "model": "continuous batching: <= max_seqs running, <= step_tokens a step, one "
                     "decode token per running request first, then chunked prefill FCFS; a "
                     "finished request frees its place after its step; "
                     + ("runs until every request finished" if args.drain else
                        "the queue never empty (stops before the step that would empty it)")
                     + "; prefix caching assumed (no repeated prefixes)",
            "max_seqs": args.max_seqs,
            "step_tokens": args.step_tokens,
            "prompt_tokens_lognormal": list(args.prompt_lognormal),
            "output_tokens_lognormal": list(args.output_lognormal),
            "length_rule": args.length_rule + ": " + LENGTH_RULE_TEXT[args.length_rule],
            "steps": int(len(counts)),
            "steps_file": f"{name}.steps.u32",
            "seed": args.seed,
        },
        "generator": GENERATOR,
    }


def write_outputs(args, ids, counts, docs):
    args.out.mkdir(parents=True, exist_ok=True)
    ids.astype("<u8").tofile(args.out / f"{args.name}.u64")
    counts.astype("<u4").tofile(args.out / f"{args.name}.steps.u32")
    with open(args.out / f"{args.name}.docs.json", "w") as f:
        f.write("[\n" + ",\n".join(json.dumps(d, indent=0) for d in docs) + "\n]")


def write_texts(args, requests):
    """The sampled documents' texts under --out/NAME.texts/, at their docs-file names."""
    for req in requests:
        path = args.out / f"{args.name}.texts" / doc_file(req.doc)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(req.doc.text(), encoding="utf-8")


def print_summary(meta, counts, share, slope, slope_unique, prefill_rows):
    tokens = meta["tokens"]
    print(f"{meta['file']}: {meta['lookups']:,} lookups, {meta['distinct_rows']:,} distinct rows "
          f"({meta['distinct_rows'] / meta['engram']['rows_R']:.1%} of R), "
          f"{len(counts):,} steps, {tokens:,} tokens ({meta['prompt_tokens']:,} prompt, "
          f"{meta['output_tokens']:,} output), {meta['corpus']['requests']} requests "
          f"{meta['corpus']['requests_by_source']}")
    print(f"  repeats within a step: {share:.1%} of lookups; Zipf-like slope {slope:.3f} per "
          f"lookup, {slope_unique:.3f} after removing repeats within a step; "
          f"a full prefill step: {prefill_rows:,.0f} distinct rows (median); tokenizer vocab {meta['tokenizer']['vocab']}, compressed "
          f"{meta['tokenizer']['engram_compressed_vocab']}")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("/tmp/traces"),
                   help="folder the trace files are written to")
    p.add_argument("--name", default="trace", help="file name stem of the trace (NAME.u64, ...)")
    p.add_argument("--cache", type=Path, default=None,
                   help="folder the trained tokenizer is cached in (None: OUT/cache)")
    p.add_argument("--salt", default="fetchahead-1",
                   help="split salt: sha256(salt || 0 || text) mod 100 picks a document's split")
    p.add_argument("--split", choices=("give", "keep", "tok"), default="give",
                   help="split the requests' documents come from")
    p.add_argument("--mix", type=parse_mix, default=parse_mix("rustdoc=0.4,man=0.3,pystd=0.3"),
                   help="each request's source is drawn with these weights")
    p.add_argument("--requests", type=int, default=300, help="number of requests")
    p.add_argument("--seed", type=int, default=1,
                   help="seed of the document and length draws")
    p.add_argument("--vocab", type=int, default=38000, help="BPE vocabulary size to train")
    p.add_argument("--tok-docs", type=int, default=0,
                   help="tok-split documents a source the tokenizer trains on (0: all)")
    p.add_argument("--rust-docs", type=Path, default=RUST_HTML,
                   help="the Rust toolchain's share/doc/rust/html (rustdoc source)")
    p.add_argument("--man-root", type=Path, default=MAN_ROOT,
                   help="the man pages' root, holding man1 .. man8 (man source)")
    p.add_argument("--pystd-root", type=Path, default=PYSTD_ROOT,
                   help="a CPython lib/python3.X (pystd source)")
    p.add_argument("--engram-from", type=Path, default=REFERENCE_JSON,
                   help="trace description whose engram section (hash columns, multipliers) "
                        "is used")
    p.add_argument("--man-text", choices=sorted(MAN_READERS), default="strip",
                   help="man pages as text: strip resolves the troff source (no layout, as in "
                        "the reference); groff renders them for a terminal")
    p.add_argument("--max-seqs", type=int, default=16, help="most requests running at once")
    p.add_argument("--step-tokens", type=int, default=2048, help="most tokens in one step")
    p.add_argument("--prompt-lognormal", type=float, nargs=3, default=(1500, 0.9, 12000),
                   metavar=("MEDIAN", "SIGMA", "CAP"), help="prompt length draw")
    p.add_argument("--output-lognormal", type=float, nargs=3, default=(250, 0.8, 2000),
                   metavar=("MEDIAN", "SIGMA", "CAP"), help="output length draw")
    p.add_argument("--length-rule", choices=sorted(LENGTH_RULES), default="window",
                   help="where a request's tokens come from in its document: window, as the "
                        "reference's requests show (a window at a drawn place, a short "
                        "document whole with its tokens shared in the drawn proportion); "
                        "prompt-first, the document's first tokens, the prompt taking its "
                        "draw first")
    p.add_argument("--drain", action="store_true",
                   help="run until every request finished, instead of stopping before the "
                        "step that would empty the queue (the reference's rule)")
    p.add_argument("--xz", action="store_true", help="also write NAME.u64.xz")
    p.add_argument("--texts", action="store_true",
                   help="also write the sampled documents' texts under OUT/NAME.texts/")
    p.add_argument("--no-check", action="store_true",
                   help="skip rebuilding the steps from the documents as requests.rs does")
    args = p.parse_args(argv)
    args.cache = args.cache or args.out / "cache"
    return args


def main(argv=None):
    global RUST_HTML, MAN_ROOT, PYSTD_ROOT
    args = parse_args(argv)
    RUST_HTML, MAN_ROOT, PYSTD_ROOT = args.rust_docs, args.man_root, args.pystd_root
    salt = args.salt.encode("utf-8")
    TEXT_READERS["man"] = MAN_READERS[args.man_text]
    engram = EngramHash.from_description(args.engram_from)
    corpus = read_corpus(salt)
    bpe, bpe_path, training = train_tokenizer(corpus, args)
    table = compression_table(bpe)
    engram.check_no_overflow(int(table.max()))
    log(f"compression: {bpe.get_vocab_size()} BPE ids -> {int(table.max()) + 1} compressed ids")
    requests = make_requests(corpus, args, bpe, table, engram)
    steps = schedule(requests, args.max_seqs, args.step_tokens, args.drain)
    counts = step_counts(steps, requests)
    ids = trace_ids(steps, requests)
    docs = [r.description() for r in requests]
    log(f"scheduler: {len(steps)} steps, {int(counts.sum())} tokens, {len(ids)} ids")
    if not args.no_check:
        check_trace(counts, docs, ids, requests, engram.ids_per_token)
    write_outputs(args, ids, counts, docs)
    meta = description(args, salt, ids, counts, requests, engram, bpe_path, bpe, table, training)
    (args.out / f"{args.name}.json").write_text(json.dumps(meta, indent=1))
    if args.texts:
        write_texts(args, requests)
    if args.xz:
        write_xz(args.out / f"{args.name}.u64")
    rows_r = int(engram.section["rows_R"])
    firsts = first_asks(ids, counts, engram.ids_per_token, rows_r)
    share = 1 - len(firsts) / max(1, len(ids))
    log(f"wrote {args.out}/{args.name}.{{u64,steps.u32,docs.json,json}}")
    print_summary(meta, counts, share, zipf_slope(ids), zipf_slope(firsts % np.uint64(rows_r)),
                  full_prefill_rows(firsts, counts, args.step_tokens, rows_r))


if __name__ == "__main__":
    main()
