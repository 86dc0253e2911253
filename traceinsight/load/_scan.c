/* traceinsight.load._scan: the native event scanner of the loader (optional; see native.py).
 *
 * configure(fields, limits) is called once, at import, with the loader's field list
 * (``schema.EVENT_FIELDS``: JSON key, whether it sits in ``args``, its role) and limits
 * (``schema.LIMITS``), so the fields are declared once, in Python.
 *
 * scan(buffer, start, state, depth[, max_rows]) reads the events of a trace's ``traceEvents`` array
 * from ``buffer``, beginning at ``start`` in ``state`` (0: just after the ``[``; 1: after an event,
 * so a ``,`` or ``]`` must come; 2: after a ``,``, so an element must come) with the array at nesting
 * ``depth``; it stops after the event that makes ``max_rows`` rows (if given, > 0), so that the
 * memory of one scan is bounded by rows, not by bytes (a run of tiny events makes many rows). For every complete ``"ph": "X"`` or ``"ph": "i"`` event (a row, its phase given in a
 * column of bytes after the others: 1 X, 2 i) it gives each configured field as a column of
 * (kind, value): kind 0 = None (missing, null, a list or an object), 1 = int (booleans are 0/1, as
 * in the reference decoder), 2 = float (value holds the double's bits; NaN and infinities too),
 * 3 = string (value is an index into the run's list of distinct strings), 4 = a float time already
 * in ns (see text_ns), 5 = an integer beyond int64 (value indexes its digits among the strings).
 * It counts every event object, the elements that are not objects, and each ``cat``.
 *
 * Everything it passes over is validated as JSON exactly as Python's ``json`` reads a UTF-8 text
 * (NaN and Infinity included), so a file the scanner reads is one the reference decoder reads the
 * same way. Invalid JSON and the limits (nesting depth, string length, integer digits) raise
 * ``Invalid(kind, offset)``. Strings longer than ``cut`` bytes are returned as a prefix with their
 * full length in characters (the loader cuts long strings anyway), so a huge name costs no copy.
 *
 * The columns reach Python as they were filled, without a copy: one buffer (a ``Block``, which owns
 * its memory and frees it when the last view of it goes) per field's values (int64) and kinds
 * (uint8), the X/i phases, then the same for the ROLE_INSTANT fields over their own rows.
 *
 * Scanning runs without the GIL; Python objects are made only for the distinct strings.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

#define MAX_FIELDS 32
enum { ROLE_VALUE = 0, ROLE_TIME = 1, ROLE_CATEGORY = 2, ROLE_INSTANT = 3, ROLE_JSON = 4 };
enum { K_NONE = 0, K_INT = 1, K_FLOAT = 2, K_STR = 3, K_NS = 4, K_BIG = 5 };
/* Inside the scanner only: a float whose double is not made yet (its text is in the Val). */
enum { K_FLOAT_TEXT = 6 };
enum { S_START = 0, S_AFTER_EVENT = 1, S_AFTER_COMMA = 2 };
/* Row kinds: events of other phases give no row. */
enum { PH_OTHER = 0, PH_X = 1, PH_I = 2 };
/* Key lookups that are not configured fields. */
enum { KEY_OTHER = -1, KEY_PH = -2, KEY_ARGS = -3 };

/* Outcomes of the scanning functions. */
enum { OK = 0, NEED_MORE = 1, BAD = 2, NOMEM = 3, DEEP = 4, LONG_STRING = 5, LONG_NUMBER = 6 };

static PyObject *Invalid;

/* A column handed to Python: read-only bytes that this object owns (malloc'd by the scan). */
typedef struct {
    PyObject_HEAD void *data;
    Py_ssize_t len;
} Block;

static void block_dealloc(Block *b) {
    free(b->data);
    Py_TYPE(b)->tp_free((PyObject *)b);
}

static int block_getbuffer(Block *b, Py_buffer *view, int flags) {
    return PyBuffer_FillInfo(view, (PyObject *)b, b->data, b->len, 1, flags);
}

static PyBufferProcs block_buffer = {(getbufferproc)block_getbuffer, NULL};

static PyTypeObject BlockType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "traceinsight.load._scan.Block",
    .tp_basicsize = sizeof(Block),
    .tp_dealloc = (destructor)block_dealloc,
    .tp_as_buffer = &block_buffer,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A scanned column (read-only bytes, shared without a copy).",
};

/* ``columns`` + a Block taking over ``*data`` (``len`` > 0 bytes used; the rest of its allocation
 * given back): 0, or 1 on failure. ``*data`` is NULL after, so the scan's cleanup skips it. */
static int hand_over(PyObject *columns, void **data, Py_ssize_t len) {
    Block *b = PyObject_New(Block, &BlockType);
    if (!b) return 1;
    void *kept = realloc(*data, (size_t)len);
    b->data = kept ? kept : *data; /* could not shrink: kept whole */
    b->len = len;
    *data = NULL;
    int fail = PyList_Append(columns, (PyObject *)b) < 0;
    Py_DECREF(b);
    return fail;
}

typedef struct {
    char *key;
    Py_ssize_t len;
    int in_args;
    int role;
} FieldSpec;

/* Set by configure() (with the GIL held, before any scan). */
static FieldSpec specs[MAX_FIELDS];
static int n_fields = 0;
static int f_category = -1;
/* Whether each field is a time (converted to ns from its text where exact). */
static unsigned char is_time[MAX_FIELDS];
/* Whether each field is read only from "i" events (ROLE_INSTANT: a column of their own rows). */
static unsigned char is_instant[MAX_FIELDS];
/* Whether each field keeps a list or object value as its JSON text (ROLE_JSON: a string of the
 * raw bytes, validated as they are skipped) instead of None. */
static unsigned char is_json[MAX_FIELDS];
static int n_instant = 0;
/* The fields in ``args`` (reset when an event has a second "args"), as bits. */
static uint32_t args_mask = 0;

/* Keys by [in args][length]: the field index, KEY_PH or KEY_ARGS. */
#define MAX_KEY 32
#define MAX_SAME_LENGTH 8
typedef struct {
    const char *key;
    uint64_t head, tail; /* see key_words */
    int result;
} KeyEntry;
static KeyEntry key_table[2][MAX_KEY + 1][MAX_SAME_LENGTH];
static int key_count[2][MAX_KEY + 1];
/* By [in args][length][first byte]: 1 + the entry's index in key_table, 0 none, SHARED_SLOT when
 * several keys share the length and first byte (then key_table is searched). */
#define SHARED_SLOT 255
static unsigned char key_slot[2][MAX_KEY + 1][256];

static inline void key_words(const char *p, Py_ssize_t n, uint64_t *head, uint64_t *tail);

static int add_key(const char *key, Py_ssize_t len, int in_args, int result) {
    if (len < 1 || len > MAX_KEY || key_count[in_args][len] == MAX_SAME_LENGTH) return -1;
    int index = key_count[in_args][len]++;
    KeyEntry *entry = &key_table[in_args][len][index];
    entry->key = key;
    entry->result = result;
    key_words(key, len, &entry->head, &entry->tail);
    unsigned char *slot = &key_slot[in_args][len][(unsigned char)key[0]];
    *slot = *slot ? SHARED_SLOT : (unsigned char)(index + 1);
    return 0;
}
static Py_ssize_t max_depth = 512, max_string = (Py_ssize_t)1 << 30, cut_string = 1 << 16, cut_prefix = 1 << 14,
                  max_int_digits = 4300;

typedef struct {
    const char *p; /* raw bytes between the quotes (escapes kept) */
    Py_ssize_t n;
    Py_ssize_t keep; /* bytes handed to Python: n, or a prefix of a long string */
    int64_t chars;   /* -1, or the full length in characters of a long string */
    uint64_t hash;
    int64_t count;   /* events whose cat is this string */
    int64_t cat_seq; /* order in which it was first seen as a cat */
    int escaped;
} Entry;

/* The keys a member of an event (or of its "args") had in earlier events at the same place, the
 * two last different ones: Kineto writes the keys of each kind of event in one order (X events
 * and flow events alternate), so the next key is usually the same bytes as one of them, which are
 * then compared whole instead of lexed and looked up (see object_fields). */
#define PRED_MEMBERS 24
#define PRED_BYTES 32
typedef struct {
    uint64_t head, tail; /* see key_words */
    uint8_t len;         /* 0: none yet */
    int8_t field;        /* what key_field gave for it */
    char text[PRED_BYTES];
} Pred;

typedef struct {
    /* distinct strings */
    Entry *entries;
    Py_ssize_t n_entries, cap_entries;
    int32_t *slots; /* open addressing: index + 1, 0 = empty */
    Py_ssize_t n_slots;
    /* columns of the X events */
    uint8_t *kinds[MAX_FIELDS];
    int64_t *values[MAX_FIELDS];
    uint8_t *phases; /* PH_X or PH_I per row */
    Py_ssize_t rows, cap_rows;
    /* Rows of the ROLE_INSTANT fields: one per PH_I row, in order (their kinds/values above). */
    Py_ssize_t side_rows, cap_side;
    /* counts over every element */
    int64_t events, skipped, other_cat, other_seq, cat_seq;
    /* the two last keys seen at each member of an event [0] and of its "args" [1] */
    Pred pred[2][PRED_MEMBERS][2];
    /* copies of long json values with their whitespace dropped (see compact_json), freed with Out */
    char **owned;
    Py_ssize_t n_owned, cap_owned;
} Out;

typedef struct {
    uint8_t kind;
    int64_t value;
    const char *text; /* a number's text as written (floats, integers beyond int64) */
    Py_ssize_t tlen;
} Val;

/* The lexer's position; one per call, so that scans may run in several threads at once. */
typedef struct {
    const char *cur, *end;
} Lex;
#define cur (L->cur)
#define end_ (L->end)

/* ---------------------------------------------------------------- strings (interning) ------ */

static uint64_t hash_bytes(const char *p, Py_ssize_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ULL ^ (uint64_t)n;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = (h ^ w) * 0xBF58476D1CE4E5B9ULL;
        h ^= h >> 31;
        p += 8;
        n -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, p, (size_t)n);
    h = (h ^ w) * 0x94D049BB133111EBULL;
    h ^= h >> 29;
    return h;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Four hex digits (already validated by lex_string). */
static uint32_t hex4(const char *p) {
    return (uint32_t)(hexval(p[0]) << 12 | hexval(p[1]) << 8 | hexval(p[2]) << 4 | hexval(p[3]));
}

/* Characters of a validated raw string as Python's json decodes it: a UTF-8 sequence, an escape,
 * or an escaped surrogate pair is one character each. */
static int64_t count_chars(const char *p, Py_ssize_t n) {
    int64_t chars = 0;
    for (Py_ssize_t i = 0; i < n;) {
        unsigned char c = (unsigned char)p[i];
        if (c == '\\') {
            if (p[i + 1] == 'u') {
                uint32_t high = hex4(p + i + 2);
                i += 6;
                if (high >= 0xD800 && high <= 0xDBFF && i + 6 <= n && p[i] == '\\' && p[i + 1] == 'u') {
                    uint32_t low = hex4(p + i + 2);
                    if (low >= 0xDC00 && low <= 0xDFFF) i += 6;
                }
            } else
                i += 2;
            chars++;
        } else {
            if ((c & 0xC0) != 0x80) chars++;
            i++;
        }
    }
    return chars;
}

/* The end of the first ``want`` bytes of a validated raw string, moved on to the end of the
 * character or escape it falls in. */
static Py_ssize_t prefix_end(const char *p, Py_ssize_t n, Py_ssize_t want) {
    Py_ssize_t i = 0;
    while (i < n && i < want) {
        unsigned char c = (unsigned char)p[i];
        if (c == '\\')
            i += p[i + 1] == 'u' ? 6 : 2;
        else if (c < 0x80)
            i++;
        else if (c >= 0xF0)
            i += 4;
        else if (c >= 0xE0)
            i += 3;
        else
            i += 2;
    }
    return i < n ? i : n;
}

static int grow_slots(Out *o) {
    Py_ssize_t n = o->n_slots ? o->n_slots * 2 : 1024;
    int32_t *slots = calloc((size_t)n, sizeof(int32_t));
    if (!slots) return NOMEM;
    for (Py_ssize_t i = 0; i < o->n_entries; i++) {
        Py_ssize_t s = (Py_ssize_t)(o->entries[i].hash & (uint64_t)(n - 1));
        while (slots[s]) s = (s + 1) & (n - 1);
        slots[s] = (int32_t)(i + 1);
    }
    free(o->slots);
    o->slots = slots;
    o->n_slots = n;
    return OK;
}

/* The index of the string p[0:n] in the run's list, added if new (longer than ``cut``: only its
 * prefix crosses into Python); -1 when out of memory. */
static Py_ssize_t intern(Out *o, const char *p, Py_ssize_t n, int escaped, Py_ssize_t cut) {
    if ((o->n_entries + 1) * 2 > o->n_slots && grow_slots(o) != OK) return -1;
    uint64_t h = hash_bytes(p, n);
    Py_ssize_t mask = o->n_slots - 1, s = (Py_ssize_t)(h & (uint64_t)mask);
    while (o->slots[s]) {
        Entry *e = &o->entries[o->slots[s] - 1];
        if (e->hash == h && e->n == n && memcmp(e->p, p, (size_t)n) == 0) return o->slots[s] - 1;
        s = (s + 1) & mask;
    }
    if (o->n_entries == o->cap_entries) {
        Py_ssize_t cap = o->cap_entries ? o->cap_entries * 2 : 256;
        Entry *entries = realloc(o->entries, (size_t)cap * sizeof(Entry));
        if (!entries) return -1;
        o->entries = entries;
        o->cap_entries = cap;
    }
    Entry *e = &o->entries[o->n_entries];
    e->p = p;
    e->n = n;
    e->keep = n;
    e->chars = -1;
    if (n > cut) { /* long: only a prefix crosses into Python, with the full length */
        e->keep = prefix_end(p, n, cut_prefix);
        e->chars = count_chars(p, n);
    }
    e->hash = h;
    e->count = 0;
    e->escaped = escaped;
    o->slots[s] = (int32_t)(o->n_entries + 1);
    return o->n_entries++;
}

/* ---------------------------------------------------------------- lexing ------------------- */

/* JSON whitespace, by byte (one load and test per byte). */
static const unsigned char WHITESPACE[256] = {[' '] = 1, ['\n'] = 1, ['\r'] = 1, ['\t'] = 1};

static inline void skip_ws(Lex *L) {
    /* in locals: a byte read through a char pointer may alias L->cur, so cur++ would be a store
     * per byte */
    const char *p = cur, *e = end_;
    while (p < e && WHITESPACE[(unsigned char)*p]) p++;
    cur = p;
}

/* How long a json value (a shape) may be, its whitespace dropped, and still cross into Python
 * whole: Python's json then decodes it and keeps its compact text when that is short (numbers
 * written long, repeated keys and escapes read shorter than they are written). */
static Py_ssize_t json_cut(void) { return cut_string > PY_SSIZE_T_MAX / 16 ? cut_string : cut_string * 16; }

/* A json value (validated) longer than cut_string, in a copy with its whitespace outside strings
 * dropped, kept by ``o`` until the scan's end (*copy; NULL, nothing kept, when even that is longer
 * than json_cut(): it stays a cut string, null). So a list padded with whitespace, or written
 * long, reads as Python's json reads it. OK, or NOMEM. */
static int compact_json(Out *o, const char *p, Py_ssize_t n, const char **copy, Py_ssize_t *len) {
    *copy = NULL;
    if (o->n_owned == o->cap_owned) {
        Py_ssize_t cap = o->cap_owned ? o->cap_owned * 2 : 4;
        char **owned = realloc(o->owned, (size_t)cap * sizeof(char *));
        if (!owned) return NOMEM;
        o->owned = owned;
        o->cap_owned = cap;
    }
    Py_ssize_t most = json_cut(), size = n < most ? n : most;
    char *out = malloc((size_t)size + 1);
    if (!out) return NOMEM;
    Py_ssize_t k = 0;
    int in_string = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        char c = p[i];
        if (!in_string && WHITESPACE[(unsigned char)c]) continue;
        if (k + 2 > size + 1) { /* longer than json_cut() without its whitespace */
            free(out);
            return OK;
        }
        out[k++] = c;
        if (c == '"')
            in_string = !in_string;
        else if (c == '\\' && in_string)
            out[k++] = p[++i]; /* the escaped byte (the value is validated: one follows) */
    }
    char *fitted = realloc(out, (size_t)(k ? k : 1)); /* give back what the whitespace took */
    if (fitted) out = fitted;
    o->owned[o->n_owned++] = out;
    *copy = out;
    *len = k;
    return OK;
}

/* One UTF-8 sequence starting at a byte >= 0x80 (cur points at it); strict like Python's codec. */
static int utf8_seq(Lex *L) {
    const unsigned char *s = (const unsigned char *)cur;
    unsigned char c = s[0];
    int len;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF)
        len = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F; /* no surrogates */
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else
        return BAD;
    /* the bytes that are there must be right, even when the sequence is cut by the buffer's end */
    for (int i = 1; i < len && i < end_ - cur; i++)
        if (s[i] < (i == 1 ? lo : 0x80) || s[i] > (i == 1 ? hi : 0xBF)) return BAD;
    if (end_ - cur < len) return NEED_MORE;
    cur += len;
    return OK;
}

/* A string; cur is at the opening quote. On OK, p and n give the raw contents and cur is past it.
 * A string longer than max_string is LONG_STRING, with cur at its opening quote. */
static int lex_string(Lex *L, const char **p, Py_ssize_t *n, int *escaped) {
    const char *quote = cur;
    cur++;
    const char *start = cur;
    int esc = 0;
    for (;;) {
        /* the common case: plain ASCII, 16 bytes at a time where SSE2 is there */
#ifdef __SSE2__
        while (end_ - cur >= 16) {
            __m128i chunk = _mm_loadu_si128((const __m128i *)cur);
            __m128i special = _mm_or_si128(
                _mm_or_si128(_mm_cmpeq_epi8(chunk, _mm_set1_epi8('"')), _mm_cmpeq_epi8(chunk, _mm_set1_epi8('\\'))),
                /* bytes < 0x20 or >= 0x80: signed compare against 0x20 catches both */
                _mm_cmplt_epi8(chunk, _mm_set1_epi8(0x20)));
            int mask = _mm_movemask_epi8(special);
            if (mask) {
                cur += __builtin_ctz((unsigned)mask);
                break;
            }
            cur += 16;
        }
#endif
        while (cur < end_) {
            unsigned char c = (unsigned char)*cur;
            if (c == '"' || c == '\\' || c < 0x20 || c >= 0x80) break;
            cur++;
        }
        if (cur >= end_) {
            if (cur - start <= max_string) return NEED_MORE;
            cur = quote;
            return LONG_STRING;
        }
        unsigned char c = (unsigned char)*cur;
        if (c == '"') {
            if (cur - start > max_string) {
                cur = quote;
                return LONG_STRING;
            }
            *p = start;
            *n = cur - start;
            *escaped = esc;
            cur++;
            return OK;
        }
        if (c < 0x20) return BAD;
        if (c >= 0x80) {
            int r = utf8_seq(L);
            if (r != OK) return r;
            continue;
        }
        /* backslash */
        esc = 1;
        if (end_ - cur < 2) return NEED_MORE;
        char e = cur[1];
        if (e == 'u') {
            for (int i = 2; i < 6 && i < end_ - cur; i++)
                if (hexval(cur[i]) < 0) return BAD;
            if (end_ - cur < 6) return NEED_MORE;
            cur += 6;
        } else if (e == '"' || e == '\\' || e == '/' || e == 'b' || e == 'f' || e == 'n' || e == 'r' ||
                   e == 't') {
            cur += 2;
        } else
            return BAD;
    }
}

/* The UTF-8 of a validated raw string with its escapes decoded, into out[0:cap]; its length, or
 * -1 when it does not fit or holds a lone surrogate (then it equals no key and no phase). */
static Py_ssize_t unescape(const char *p, Py_ssize_t n, char *out, Py_ssize_t cap) {
    Py_ssize_t o = 0;
    for (Py_ssize_t i = 0; i < n;) {
        uint32_t cp;
        if (p[i] != '\\') {
            if (o >= cap) return -1;
            out[o++] = p[i++];
            continue;
        }
        switch (p[i + 1]) {
            case 'b': cp = '\b'; break;
            case 'f': cp = '\f'; break;
            case 'n': cp = '\n'; break;
            case 'r': cp = '\r'; break;
            case 't': cp = '\t'; break;
            case 'u': cp = 0; break;
            default: cp = (uint32_t)(unsigned char)p[i + 1]; break; /* " \ / */
        }
        if (p[i + 1] != 'u')
            i += 2;
        else {
            cp = hex4(p + i + 2);
            i += 6;
            if (cp >= 0xDC00 && cp <= 0xDFFF) return -1;
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                if (!(i + 6 <= n && p[i] == '\\' && p[i + 1] == 'u')) return -1;
                uint32_t low = hex4(p + i + 2);
                if (low < 0xDC00 || low > 0xDFFF) return -1;
                cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
                i += 6;
            }
        }
        char utf8[4];
        int len;
        if (cp < 0x80) {
            utf8[0] = (char)cp;
            len = 1;
        } else if (cp < 0x800) {
            utf8[0] = (char)(0xC0 | cp >> 6);
            utf8[1] = (char)(0x80 | (cp & 0x3F));
            len = 2;
        } else if (cp < 0x10000) {
            utf8[0] = (char)(0xE0 | cp >> 12);
            utf8[1] = (char)(0x80 | (cp >> 6 & 0x3F));
            utf8[2] = (char)(0x80 | (cp & 0x3F));
            len = 3;
        } else {
            utf8[0] = (char)(0xF0 | cp >> 18);
            utf8[1] = (char)(0x80 | (cp >> 12 & 0x3F));
            utf8[2] = (char)(0x80 | (cp >> 6 & 0x3F));
            utf8[3] = (char)(0x80 | (cp & 0x3F));
            len = 4;
        }
        if (o + len > cap) return -1;
        memcpy(out + o, utf8, (size_t)len);
        o += len;
    }
    return o;
}

static const double POW10[] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
                               1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

static const uint64_t UPOW10[] = {1ULL, 10ULL, 100ULL, 1000ULL, 10000ULL, 100000ULL, 1000000ULL,
                                   10000000ULL, 100000000ULL, 1000000000ULL, 10000000000ULL,
                                   100000000000ULL, 1000000000000ULL, 10000000000000ULL,
                                   100000000000000ULL, 1000000000000000ULL, 10000000000000000ULL};

static int clz128(unsigned __int128 x) {
    uint64_t hi = (uint64_t)(x >> 64), lo = (uint64_t)x;
    return hi ? __builtin_clzll(hi) : 64 + __builtin_clzll(lo);
}

/* The correctly rounded double of m / 10^k, for 2^53 <= m < 2^64 and k <= 16, by exact integer
 * division: (m << 64) / 10^k keeps at least 64 significant bits, the remainder says whether
 * anything below them is nonzero, and the top 53 bits are rounded half to even. */
static double exact_quotient(uint64_t m, int k) {
    unsigned __int128 num = (unsigned __int128)m << 64;
    unsigned __int128 q = num / UPOW10[k];
    int sticky = (num % UPOW10[k]) != 0;
    int bits = 128 - clz128(q);
    int shift = bits - 53;
    uint64_t mant = (uint64_t)(q >> shift);
    unsigned __int128 rest = q & ((((unsigned __int128)1) << shift) - 1);
    unsigned __int128 half = ((unsigned __int128)1) << (shift - 1);
    if (rest > half || (rest == half && (sticky || (mant & 1)))) {
        mant++;
        if (mant == (1ULL << 53)) {
            mant >>= 1;
            shift++;
        }
    }
    return ldexp((double)mant, shift - 64);
}

/* A plain "digits.digits" number (no exponent) as the correctly rounded double: Clinger's fast path
 * (m < 2^53 and 10^k exact, so one IEEE division rounds once) or an exact integer division;
 * 0 when neither applies (more than 19 digits, an exponent): strtod then. */
static int fast_double(const char *s, const char *e, double *out) {
    int neg = *s == '-';
    const char *p = s + neg;
    uint64_t m = 0;
    int digits = 0, frac = 0, seen_dot = 0;
    for (; p < e; p++) {
        if (*p == '.') {
            seen_dot = 1;
            continue;
        }
        if (*p < '0' || *p > '9') return 0; /* an exponent: strtod */
        if (m || *p != '0') digits++;
        if (digits > 19) return 0;
        m = m * 10 + (uint64_t)(*p - '0');
        frac += seen_dot;
    }
    double d;
    if (m < (1ULL << 53) && frac <= 22)
        d = (double)m / POW10[frac];
    else if (m >= (1ULL << 53) && frac <= 16)
        d = exact_quotient(m, frac);
    else
        return 0;
    *out = neg ? -d : d;
    return 1;
}

/* strtod on a copy of s[0:len] (the buffer is not NUL-terminated); correctly rounded, like
 * Python's float(). 0 when out of memory. */
static int parse_double(const char *s, Py_ssize_t len, double *out) {
    char small[64];
    char *tmp = len < (Py_ssize_t)sizeof(small) ? small : malloc((size_t)len + 1);
    if (!tmp) return 0;
    memcpy(tmp, s, (size_t)len);
    tmp[len] = 0;
    *out = strtod(tmp, NULL);
    if (tmp != small) free(tmp);
    return 1;
}

/* A number; cur is at '-' or a digit. Integers that fit int64 → K_INT, longer ones → K_BIG (their
 * text), others → K_FLOAT_TEXT (their text; the event makes the double if it needs one). An
 * integer of more than max_int_digits digits is LONG_NUMBER (Python's json refuses it). ``keep``
 * 0: only the grammar matters (the value is skipped). */
static int lex_number(Lex *L, Val *v, int keep) {
    const char *s = cur;
    const char *p = cur;
    int neg = 0, is_float = 0;
/* the buffer ends inside the number: more bytes are needed, unless it is already too long */
#define MORE (p - s > max_string ? LONG_NUMBER : NEED_MORE)
    if (*p == '-') {
        neg = 1;
        p++;
    }
    if (p >= end_) return NEED_MORE;
    uint64_t acc = 0; /* the whole part's value, kept when it is an integer of at most 19 digits */
    if (*p == '0') {
        p++;
    } else if (*p >= '1' && *p <= '9') {
        while (p < end_ && *p >= '0' && *p <= '9') acc = acc * 10 + (uint64_t)(*p++ - '0');
    } else
        return BAD;
    Py_ssize_t digits = p - (s + neg);
    if (p < end_ && *p == '.') {
        is_float = 1;
        p++;
        const char *d = p;
        while (p < end_ && *p >= '0' && *p <= '9') p++;
        if (p == d) return p >= end_ ? MORE : BAD;
    }
    if (p < end_ && (*p == 'e' || *p == 'E')) {
        is_float = 1;
        p++;
        if (p < end_ && (*p == '+' || *p == '-')) p++;
        const char *d = p;
        while (p < end_ && *p >= '0' && *p <= '9') p++;
        if (p == d) return p >= end_ ? MORE : BAD;
    }
    if (p >= end_) return MORE; /* a number is never the last byte of a run of events */
#undef MORE
    if (!is_float && digits > max_int_digits) return LONG_NUMBER;
    Py_ssize_t len = p - s;
    if (!keep) {
        cur = p;
        return OK;
    }
    if (!is_float) {
        const char *d = s + neg;
        if (digits > 19 ||
            (digits == 19 && memcmp(d, neg ? "9223372036854775808" : "9223372036854775807", 19) > 0)) {
            v->kind = K_BIG; /* beyond int64: its digits go to Python as a string */
            v->text = s;
            v->tlen = len;
        } else {
            v->kind = K_INT;
            v->value = neg ? (int64_t)(0 - acc) : (int64_t)acc;
        }
    } else {
        v->kind = K_FLOAT_TEXT; /* the event makes the double if it needs one */
        v->text = s;
        v->tlen = len;
    }
    cur = p;
    return OK;
}

static int lex_literal(Lex *L, const char *word, Py_ssize_t n) {
    if (end_ - cur < n) return memcmp(cur, word, (size_t)(end_ - cur)) == 0 ? NEED_MORE : BAD;
    if (memcmp(cur, word, (size_t)n) != 0) return BAD;
    cur += n;
    return OK;
}

/* NaN, Infinity, -Infinity: not JSON, but Python's json reads (and writes) them. */
static int lex_nonfinite(Lex *L, Val *v) {
    int r;
    double d;
    if (*cur == 'N') {
        r = lex_literal(L, "NaN", 3);
        d = NAN;
    } else if (*cur == 'I') {
        r = lex_literal(L, "Infinity", 8);
        d = INFINITY;
    } else {
        r = lex_literal(L, "-Infinity", 9);
        d = -INFINITY;
    }
    if (r == OK) {
        v->kind = K_FLOAT;
        v->text = NULL;
        v->tlen = 0;
        memcpy(&v->value, &d, sizeof d);
    }
    return r;
}

/* The ':' after a key, with the whitespace around it. */
static int lex_colon(Lex *L) {
    skip_ws(L);
    if (cur >= end_) return NEED_MORE;
    if (*cur != ':') return BAD;
    cur++;
    skip_ws(L);
    return cur >= end_ ? NEED_MORE : OK;
}

/* After a member of a container: skips to ',' (another member follows: *more = 1, cur past it
 * and the whitespace after it) or to the closing byte (*more = 0, cur past it). */
static int next_member(Lex *L, char close, int *more) {
    skip_ws(L);
    if (cur >= end_) return NEED_MORE;
    if (*cur == close) {
        cur++;
        *more = 0;
        return OK;
    }
    if (*cur != ',') return BAD;
    cur++;
    skip_ws(L);
    if (cur >= end_) return NEED_MORE;
    *more = 1;
    return OK;
}

static int skip_value(Lex *L, int depth);

/* An object or array at cur, at nesting ``depth`` (the top-level value is at depth 1). */
static int skip_container(Lex *L, int depth, char close) {
    if (depth > max_depth) return DEEP;
    cur++;
    skip_ws(L);
    if (cur >= end_) return NEED_MORE;
    if (*cur == close) {
        cur++;
        return OK;
    }
    for (;;) {
        int r;
        if (close == '}') {
            if (*cur != '"') return BAD;
            const char *p;
            Py_ssize_t n;
            int e;
            if ((r = lex_string(L, &p, &n, &e)) != OK || (r = lex_colon(L)) != OK) return r;
        }
        if ((r = skip_value(L, depth + 1)) != OK) return r;
        int more;
        if ((r = next_member(L, close, &more)) != OK || !more) return r;
    }
}

/* Any value, validated and skipped; cur is at its first byte; ``depth``: its nesting if it is a
 * container. */
static int skip_value(Lex *L, int depth) {
    const char *p;
    Py_ssize_t n;
    int e;
    Val v;
    switch (*cur) {
        case '"': return lex_string(L, &p, &n, &e);
        case '{': return skip_container(L, depth, '}');
        case '[': return skip_container(L, depth, ']');
        case 't': return lex_literal(L, "true", 4);
        case 'f': return lex_literal(L, "false", 5);
        case 'n': return lex_literal(L, "null", 4);
        case 'N':
        case 'I': return lex_nonfinite(L, &v);
        case '-':
            if (end_ - cur < 2) return NEED_MORE;
            if (cur[1] == 'I') return lex_nonfinite(L, &v);
            return lex_number(L, &v, 0);
        default:
            if (*cur >= '0' && *cur <= '9') return lex_number(L, &v, 0);
            return BAD;
    }
}

/* A value kept as a scalar (the reference's ``_scalar``): lists and objects become None. */
static int scalar(Lex *L, Val *v, const char **sp, Py_ssize_t *sn, int *sesc, int depth) {
    int r;
    switch (*cur) {
        case '"':
            if ((r = lex_string(L, sp, sn, sesc)) != OK) return r;
            v->kind = K_STR;
            v->value = -1; /* interned by the caller when kept */
            return OK;
        case 't':
            v->kind = K_INT;
            v->value = 1;
            return lex_literal(L, "true", 4);
        case 'f':
            v->kind = K_INT;
            v->value = 0;
            return lex_literal(L, "false", 5);
        case 'n':
            v->kind = K_NONE;
            return lex_literal(L, "null", 4);
        case '{':
        case '[':
            v->kind = K_NONE;
            return skip_value(L, depth);
        case 'N':
        case 'I': return lex_nonfinite(L, v);
        case '-':
            if (end_ - cur < 2) return NEED_MORE;
            if (cur[1] == 'I') return lex_nonfinite(L, v);
            return lex_number(L, v, 1);
        default:
            if (*cur >= '0' && *cur <= '9') return lex_number(L, v, 1);
            return BAD;
    }
}

static const int64_t IPOW10[] = {1, 10, 100, 1000, 10000, 100000, 1000000};

/* 2|D| against `unit` (D, unit > 0 in the same scale): -1 below, 0 equal, 1 above. */
static int cmp_twice(__int128 d, __int128 unit) {
    if (d < 0) d = -d;
    d *= 2;
    return d < unit ? -1 : d > unit ? 1 : 0;
}

/* The reference's rule on a time's plain-notation text (the whole part's value and the fraction's
 * digits f0..f1, trailing zeros dropped): whole × 1000 + three fraction digits, +1 when the fourth
 * is 5 or more, signed. */
static inline int64_t repr_ns(int neg, int64_t whole, const char *f0, const char *f1) {
    int64_t frac = 0;
    for (int i = 0; i < 3; i++) frac = frac * 10 + (f0 + i < f1 ? f0[i] - '0' : 0);
    if (f1 - f0 > 3 && f0[3] >= '5') frac++;
    int64_t value = whole * 1000 + frac;
    return neg ? -value : value;
}

/* The reference's ns for a float time (``coerce.float_us_to_ns``: the plain-notation text of
 * ``repr(float)``, whole × 1000 + three fraction digits, +1 when the fourth is 5 or more, signed),
 * computed from the number's own text when that text provably is ``repr``'s: it has at most 15
 * significant digits (two such decimals never round to one double), or, with 16 to 19, it is
 * the double's correctly rounded decimal of its length (ties to even, as repr) and no decimal
 * one digit shorter rounds to the same double. 0 when not proven (Python then takes the value). */
static int text_ns(const char *s, Py_ssize_t len, double d, int64_t *ns) {
    double a = fabs(d);
    if (!s || !(a >= 1e-4 && a < 9e15)) return 0; /* repr switches to exponents; Int64 ns bound */
    const char *p = s, *e = s + len;
    int neg = *p == '-';
    p += neg;
    const char *w0 = p;
    while (p < e && *p >= '0' && *p <= '9') p++;
    const char *w1 = p;
    if (p >= e || *p != '.') return 0; /* an exponent */
    const char *f0 = ++p, *f1 = e;
    for (const char *q = f0; q < f1; q++)
        if (*q < '0' || *q > '9') return 0;
    while (f1 > f0 && f1[-1] == '0') f1--;
    Py_ssize_t n; /* significant digits */
    if (w1 - w0 == 1 && *w0 == '0') {
        const char *z = f0;
        while (z < f1 && *z == '0') z++;
        n = f1 - z;
    } else
        n = (w1 - w0) + (f1 - f0);
    if (n > 19) return 0;
    int f = (int)(f1 - f0);
    if (n > 15 && f > 0) {
        if (f > 6) return 0;
        uint64_t T = 0;
        for (const char *q = w0; q < w1; q++) T = T * 10 + (uint64_t)(*q - '0');
        for (const char *q = f0; q < f1; q++) T = T * 10 + (uint64_t)(*q - '0');
        int ex;
        double m = frexp(a, &ex);
        uint64_t N = (uint64_t)ldexp(m, 53);
        int q = 53 - ex;
        if (q < 0 || q > 60 || N == (1ULL << 52)) return 0;
        __int128 scale = (__int128)1 << q;
        /* the text is the double's correctly rounded decimal of f fraction digits */
        int c = cmp_twice((__int128)T * scale - (__int128)N * IPOW10[f], scale);
        if (c > 0 || (c == 0 && (T & 1))) return 0;
        /* and no decimal with one digit less rounds to the double */
        uint64_t lo = T / 10;
        for (uint64_t t2 = lo; t2 <= lo + 1; t2++) {
            int c2 = cmp_twice((__int128)t2 * scale - (__int128)N * IPOW10[f - 1], IPOW10[f - 1]);
            if (c2 < 0 || (c2 == 0 && !(N & 1))) return 0;
        }
    }
    int64_t whole = 0;
    for (const char *q = w0; q < w1; q++) whole = whole * 10 + (*q - '0');
    *ns = repr_ns(neg, whole, f0, f1);
    return 1;
}

/* text_ns's result for the float texts it reads without looking at the double: no exponent, a
 * whole part that does not start with 0 (so |value| >= 1) and either at most 15 significant
 * digits (so |value| < 1e15) or no fraction but zeros and a whole part below 9e15 (exactly the
 * double, below 2^53). One pass over the text, and no double is made; 0 for every other text. */
static int plain_ns(const char *s, Py_ssize_t len, int64_t *ns) {
    const char *p = s, *e = s + len;
    int neg = *p == '-';
    p += neg;
    if (p >= e || *p < '1' || *p > '9') return 0;
    const char *w0 = p;
    int64_t whole = 0;
    while (p < e && *p >= '0' && *p <= '9' && p - w0 < 16) whole = whole * 10 + (*p++ - '0');
    if (p >= e || *p != '.') return 0; /* an exponent, or more than 16 whole digits */
    const char *f0 = ++p, *f1 = e;
    for (const char *q = f0; q < f1; q++)
        if (*q < '0' || *q > '9') return 0;
    while (f1 > f0 && f1[-1] == '0') f1--;
    if (f1 > f0 ? (p - 1 - w0) + (f1 - f0) > 15 : whole >= 9000000000000000LL) return 0;
    *ns = repr_ns(neg, whole, f0, f1);
    return 1;
}

/* ---------------------------------------------------------------- events ------------------- */

typedef struct {
    Val v;
    const char *sp;
    Py_ssize_t sn;
    int sesc;
} Field;

/* Reads `"key": ` at cur (inside an object): the key's raw bytes and whether it holds escapes. */
static int lex_key(Lex *L, const char **p, Py_ssize_t *n, int *esc) {
    int r;
    if (*cur != '"') return BAD;
    if ((r = lex_string(L, p, n, esc)) != OK) return r;
    return lex_colon(L);
}

/* A key's field index (in the event, or in its ``args``), KEY_PH, KEY_ARGS or KEY_OTHER. An
 * escaped key is compared by its decoded text, as the reference's dict sees it. Keys are looked
 * up by length, then first byte (key_table, made by configure()). */
/* A key of n bytes as two (overlapping) words, its first and its last bytes, read with loads of
 * constant size inside the key: equal words mean equal keys up to 16 bytes. */
static inline void key_words(const char *p, Py_ssize_t n, uint64_t *head, uint64_t *tail) {
    if (n >= 8) {
        memcpy(head, p, 8);
        memcpy(tail, p + n - 8, 8);
    } else if (n >= 4) {
        uint32_t a, b;
        memcpy(&a, p, 4);
        memcpy(&b, p + n - 4, 4);
        *head = a;
        *tail = b;
    } else if (n >= 2) {
        uint16_t a, b;
        memcpy(&a, p, 2);
        memcpy(&b, p + n - 2, 2);
        *head = a;
        *tail = b;
    } else
        *head = *tail = (unsigned char)p[0];
}

static inline int key_matches(const KeyEntry *entry, const char *p, Py_ssize_t n) {
    uint64_t head, tail;
    key_words(p, n, &head, &tail);
    return entry->head == head && entry->tail == tail && (n <= 16 || memcmp(entry->key, p, (size_t)n) == 0);
}

static inline int key_lookup(const char *p, Py_ssize_t n, int in_args) {
    if (n < 1 || n > MAX_KEY) return KEY_OTHER;
    int slot = key_slot[in_args][n][(unsigned char)p[0]];
    const KeyEntry *entry = key_table[in_args][n];
    if (slot == 0) return KEY_OTHER;
    if (slot != SHARED_SLOT) return key_matches(&entry[slot - 1], p, n) ? entry[slot - 1].result : KEY_OTHER;
    for (int i = 0, count = key_count[in_args][n]; i < count; i++)
        if (key_matches(&entry[i], p, n)) return entry[i].result;
    return KEY_OTHER;
}

static inline int key_field(const char *p, Py_ssize_t n, int esc, int in_args) {
    if (!esc) return key_lookup(p, n, in_args);
    char decoded[64];
    n = unescape(p, n, decoded, (Py_ssize_t)sizeof decoded);
    return n < 0 ? KEY_OTHER : key_lookup(decoded, n, in_args);
}

/* A phase string's row kind: PH_X for "X", PH_I for "i" (escaped too: "\u0058"), else PH_OTHER. */
static inline int phase_of(const char *p, Py_ssize_t n, int esc) {
    char decoded[8];
    if (esc) {
        n = unescape(p, n, decoded, (Py_ssize_t)sizeof decoded);
        p = decoded;
    }
    if (n != 1) return PH_OTHER;
    return p[0] == 'X' ? PH_X : p[0] == 'i' ? PH_I : PH_OTHER;
}

/* Whether the key at cur is ``pred``'s, byte for byte, with its closing quote in the buffer. */
static inline int key_is(const Lex *L, const Pred *pred) {
    if (!pred->len || end_ - cur <= pred->len + 1 || cur[0] != '"' || cur[pred->len + 1] != '"') return 0;
    uint64_t head, tail;
    key_words(cur + 1, pred->len, &head, &tail);
    return head == pred->head && tail == pred->tail &&
           (pred->len <= 16 || memcmp(cur + 1, pred->text, pred->len) == 0);
}

/* Which of a member's two predicted keys (``pred``: NULL past PRED_MEMBERS) is the key at cur. */
static inline const Pred *predicted(const Lex *L, const Pred *pred) {
    if (!pred) return NULL;
    return key_is(L, &pred[0]) ? &pred[0] : key_is(L, &pred[1]) ? &pred[1] : NULL;
}

/* The members of an object at cur ('{') at nesting ``depth``, each value into fields[] (bit i of
 * *seen set: fields without it are None, so nothing needs clearing per event). */
static int object_fields(Lex *L, Out *o, Field *fields, uint32_t *seen, int *phase, int in_args, int depth) {
    int r;
    if (depth > max_depth) return DEEP;
    cur++;
    skip_ws(L);
    if (cur >= end_) return NEED_MORE;
    if (*cur == '}') {
        cur++;
        return OK;
    }
    for (int member = 0;; member++) {
        int f;
        Pred *pred = member < PRED_MEMBERS ? o->pred[in_args][member] : NULL;
        const Pred *hit = predicted(L, pred);
        if (hit) {
            /* the same bytes as a predicted key, which is plain ASCII: lex_string would read
             * exactly this string, and key_field give what it gave then */
            cur += hit->len + 2;
            f = hit->field;
            if ((r = lex_colon(L)) != OK) return r;
        } else {
            const char *kp;
            Py_ssize_t kn;
            int kesc;
            if ((r = lex_key(L, &kp, &kn, &kesc)) != OK) return r;
            f = key_field(kp, kn, kesc, in_args);
            int plain = pred && !kesc && kn >= 1 && kn <= PRED_BYTES;
            for (Py_ssize_t i = 0; plain && i < kn; i++) plain = (unsigned char)kp[i] < 0x80;
            if (plain) { /* the newest first; the older one moves down */
                pred[1] = pred[0];
                pred[0].len = (uint8_t)kn;
                key_words(kp, kn, &pred[0].head, &pred[0].tail);
                memcpy(pred[0].text, kp, (size_t)kn);
                pred[0].field = (int8_t)f;
            }
        }
        if (f == KEY_ARGS) {
            /* the last "args" wins, as in a dict: reset what an earlier one gave */
            *seen &= ~args_mask;
            if (*cur == '{')
                r = object_fields(L, o, fields, seen, NULL, 1, depth + 1);
            else
                r = skip_value(L, depth + 1);
            if (r != OK) return r;
        } else if (f == KEY_PH) {
            Field tmp;
            if ((r = scalar(L, &tmp.v, &tmp.sp, &tmp.sn, &tmp.sesc, depth + 1)) != OK) return r;
            *phase = tmp.v.kind == K_STR ? phase_of(tmp.sp, tmp.sn, tmp.sesc) : PH_OTHER;
        } else if (f >= 0) {
            Field *fd = &fields[f];
            *seen |= 1U << f;
            if (is_json[f] && (*cur == '[' || *cur == '{')) {
                const char *start = cur;
                if ((r = skip_value(L, depth + 1)) != OK) return r;
                fd->v.kind = K_STR;
                fd->v.value = -1;
                fd->sp = start;
                fd->sn = cur - start;
                fd->sesc = 0;
                if (fd->sn > cut_string) {
                    const char *compact;
                    Py_ssize_t len;
                    if ((r = compact_json(o, start, fd->sn, &compact, &len)) != OK) return r;
                    if (compact) {
                        fd->sp = compact;
                        fd->sn = len;
                    }
                }
            } else if ((r = scalar(L, &fd->v, &fd->sp, &fd->sn, &fd->sesc, depth + 1)) != OK)
                return r;
            else if (is_json[f])
                fd->v.kind = K_NONE; /* a json field keeps only lists and objects */
        } else {
            if ((r = skip_value(L, depth + 1)) != OK) return r;
        }
        int more;
        if ((r = next_member(L, '}', &more)) != OK || !more) return r;
    }
}

/* Room for ``cap`` rows in the columns of the fields whose is_instant[i] is ``side``. */
static int grow_columns(Out *o, Py_ssize_t cap, int side) {
    for (int i = 0; i < n_fields; i++) {
        if (is_instant[i] != side) continue;
        uint8_t *k = realloc(o->kinds[i], (size_t)cap);
        if (!k) return NOMEM;
        o->kinds[i] = k;
        int64_t *v = realloc(o->values[i], (size_t)cap * sizeof(int64_t));
        if (!v) return NOMEM;
        o->values[i] = v;
    }
    return OK;
}

static int grow_rows(Out *o) {
    Py_ssize_t cap = o->cap_rows ? o->cap_rows * 2 : 4096;
    if (grow_columns(o, cap, 0) != OK) return NOMEM;
    uint8_t *p = realloc(o->phases, (size_t)cap);
    if (!p) return NOMEM;
    o->phases = p;
    o->cap_rows = cap;
    return OK;
}

static int grow_side(Out *o) {
    Py_ssize_t cap = o->cap_side ? o->cap_side * 2 : 256;
    if (grow_columns(o, cap, 1) != OK) return NOMEM;
    o->cap_side = cap;
    return OK;
}

/* One event object at cur, at nesting ``depth``. */
static int event(Lex *L, Out *o, int depth) {
    Field fields[MAX_FIELDS];
    uint32_t seen = 0;
    int phase = PH_OTHER;
    int r = object_fields(L, o, fields, &seen, &phase, 0, depth);
    if (r != OK) return r;
    o->events++;
    Py_ssize_t cat_index = -1;
    if (f_category >= 0) {
        Field *cat = &fields[f_category];
        if (seen >> f_category & 1 && cat->v.kind == K_STR) {
            cat_index = intern(o, cat->sp, cat->sn, cat->sesc, cut_string);
            if (cat_index < 0) return NOMEM;
            Entry *e = &o->entries[cat_index];
            if (!e->count++) e->cat_seq = o->cat_seq++;
        } else if (!o->other_cat++)
            o->other_seq = o->cat_seq++;
    }
    if (phase == PH_OTHER) return OK;
    if (o->rows == o->cap_rows && grow_rows(o) != OK) return NOMEM;
    Py_ssize_t main_row = o->rows++, side_row = -1;
    o->phases[main_row] = (uint8_t)phase;
    if (phase == PH_I && n_instant) {
        if (o->side_rows == o->cap_side && grow_side(o) != OK) return NOMEM;
        side_row = o->side_rows++;
    }
    for (int i = 0; i < n_fields; i++) {
        Field *fd = &fields[i];
        Py_ssize_t row = main_row;
        if (is_instant[i]) {
            if (side_row < 0) continue;
            row = side_row;
        }
        if (!(seen >> i & 1)) { /* not in this event (or reset by a later "args"): None */
            o->kinds[i][row] = K_NONE;
            o->values[i][row] = 0;
            continue;
        }
        int64_t value = fd->v.value;
        if (fd->v.kind == K_STR) {
            Py_ssize_t index =
                i == f_category ? cat_index : intern(o, fd->sp, fd->sn, fd->sesc, is_json[i] ? json_cut() : cut_string);
            if (index < 0) return NOMEM;
            value = index;
        } else if (fd->v.kind == K_BIG) {
            Py_ssize_t index = intern(o, fd->v.text, fd->v.tlen, 0, cut_string);
            if (index < 0) return NOMEM;
            value = index;
        } else if (fd->v.kind == K_NONE)
            value = 0;
        else if (fd->v.kind == K_FLOAT_TEXT) {
            if (is_time[i] && plain_ns(fd->v.text, fd->v.tlen, &value))
                fd->v.kind = K_NS;
            else {
                const char *s = fd->v.text;
                Py_ssize_t len = fd->v.tlen;
                double d; /* infinity when it overflows, as float() gives */
                if (!fast_double(s, s + len, &d) && !parse_double(s, len, &d)) return NOMEM;
                memcpy(&value, &d, sizeof d);
                fd->v.kind = K_FLOAT;
                if (is_time[i]) {
                    if (d == 0) { /* "0.0", "-0.0": repr's whole part is 0 */
                        value = 0;
                        fd->v.kind = K_NS;
                    } else if (text_ns(s, len, d, &value))
                        fd->v.kind = K_NS;
                }
            }
        }
        o->kinds[i][row] = fd->v.kind;
        o->values[i][row] = value;
    }
    return OK;
}

/* Elements from cur until the array's ']' (done) or the end of the complete ones. ``*state`` is
 * where cur stands (see the module comment) and is kept in step with ``*resume``: the place, on a
 * byte boundary between tokens, where the next scan starts. */
static int events(Lex *L, Out *o, int *state, int *done, const char **resume, int depth,
                  Py_ssize_t max_rows, int *full) {
    for (;;) {
        if (max_rows > 0 && o->rows >= max_rows) { /* full: resume after the last event */
            skip_ws(L);
            *resume = cur;
            *full = 1;
            return OK;
        }
        skip_ws(L);
        *resume = cur;
        if (cur >= end_) return OK;
        char c = *cur;
        if (*state == S_AFTER_EVENT) {
            if (c == ',') {
                cur++;
                *state = S_AFTER_COMMA;
                continue;
            }
            if (c != ']') return BAD;
        }
        if (c == ']') {
            if (*state == S_AFTER_COMMA) return BAD; /* a trailing comma */
            cur++;
            *done = 1;
            *resume = cur;
            return OK;
        }
        const char *at = cur;
        int r;
        if (c == '{')
            r = event(L, o, depth + 1);
        else { /* not an object: the reference skips it */
            r = skip_value(L, depth + 1);
            if (r == OK) o->skipped++;
        }
        if (r == NEED_MORE) {
            cur = at;
            return OK;
        }
        if (r != OK) return r;
        *state = S_AFTER_EVENT;
    }
}

static void out_free(Out *o) {
    for (Py_ssize_t i = 0; i < o->n_owned; i++) free(o->owned[i]);
    free(o->owned);
    free(o->entries);
    free(o->slots);
    for (int i = 0; i < MAX_FIELDS; i++) {
        free(o->kinds[i]);
        free(o->values[i]);
    }
    free(o->phases);
}

static const char *outcome_name(int r) {
    switch (r) {
        case DEEP: return "depth";
        case LONG_STRING: return "string";
        case LONG_NUMBER: return "number";
        default: return "json";
    }
}

/* Sets Invalid(kind, offset) (or MemoryError) for a failed outcome. */
static void raise_outcome(int r, Py_ssize_t offset) {
    if (r == NOMEM) {
        PyErr_NoMemory();
        return;
    }
    PyObject *value = Py_BuildValue("(sn)", outcome_name(r), offset);
    if (value) {
        PyErr_SetObject(Invalid, value);
        Py_DECREF(value);
    }
}

/* scan(buffer, start, state, depth[, max_rows]) -> (resume, state, done, events, skipped, rows,
 * columns, strings, escaped, cat_counts, cut, full): columns is a list of Blocks (see the top; empty
 * without rows); cat_counts are (first-seen order, string index or
 * -1 for a non-string cat, events); cut are (string index, full length in characters) of long
 * strings; full is 1 when the scan stopped at max_rows rows (resume is then after an event). */
static PyObject *scan(PyObject *Py_UNUSED(self), PyObject *args) {
    Py_buffer buf;
    Py_ssize_t start, max_rows = 0;
    int state, depth, full = 0;
    if (!PyArg_ParseTuple(args, "y*nii|n", &buf, &start, &state, &depth, &max_rows)) return NULL;
    if (start < 0 || start > buf.len || state < S_START || state > S_AFTER_COMMA || !n_fields) {
        PyBuffer_Release(&buf);
        PyErr_SetString(PyExc_ValueError, n_fields ? "start or state out of range" : "configure() first");
        return NULL;
    }
    Out o;
    memset(&o, 0, sizeof o);
    int done = 0, r;
    const char *resume;
    const char *base = buf.buf;
    Lex lex = {base + start, base + buf.len}, *L = &lex;
    Py_BEGIN_ALLOW_THREADS
    resume = cur;
    r = grow_rows(&o);
    if (r == OK) r = events(L, &o, &state, &done, &resume, depth, max_rows, &full);
    Py_END_ALLOW_THREADS
    PyObject *result = NULL;
    if (r != OK) {
        raise_outcome(r, (Py_ssize_t)(cur - base));
        goto out;
    }
    {
        PyObject *strings = PyList_New(o.n_entries), *escaped = PyList_New(0), *counts = PyList_New(0),
                 *cut = PyList_New(0);
        /* values per field, then kinds, then the rows' phases; then the same for the ROLE_INSTANT
         * fields over their own rows (none without "i" rows: those columns were never made) */
        PyObject *columns = PyList_New(0);
        int fail = !strings || !escaped || !counts || !cut || !columns;
        for (int side = 0; side < 2 && !fail && o.rows; side++) {
            Py_ssize_t rows = side ? o.side_rows : o.rows;
            if (!rows) continue;
            for (int i = 0; i < n_fields && !fail; i++)
                if (is_instant[i] == side) fail = hand_over(columns, (void **)&o.values[i], rows * 8);
            for (int i = 0; i < n_fields && !fail; i++)
                if (is_instant[i] == side) fail = hand_over(columns, (void **)&o.kinds[i], rows);
            if (!side && !fail) fail = hand_over(columns, (void **)&o.phases, rows);
        }
        for (Py_ssize_t i = 0; i < o.n_entries && !fail; i++) {
            Entry *e = &o.entries[i];
            PyObject *s = PyBytes_FromStringAndSize(e->p, e->keep);
            if (!s) {
                fail = 1;
                break;
            }
            PyList_SET_ITEM(strings, i, s);
            if (e->escaped) {
                PyObject *k = PyLong_FromSsize_t(i);
                if (!k || PyList_Append(escaped, k) < 0) fail = 1;
                Py_XDECREF(k);
            }
            if (e->chars >= 0) {
                PyObject *pair = Py_BuildValue("(nL)", i, (long long)e->chars);
                if (!pair || PyList_Append(cut, pair) < 0) fail = 1;
                Py_XDECREF(pair);
            }
            if (e->count) {
                PyObject *pair = Py_BuildValue("(LnL)", (long long)e->cat_seq, i, (long long)e->count);
                if (!pair || PyList_Append(counts, pair) < 0) fail = 1;
                Py_XDECREF(pair);
            }
        }
        if (!fail && o.other_cat) { /* non-string categories, counted as "" (index -1) */
            PyObject *pair = Py_BuildValue("(LnL)", (long long)o.other_seq, (Py_ssize_t)-1, (long long)o.other_cat);
            if (!pair || PyList_Append(counts, pair) < 0) fail = 1;
            Py_XDECREF(pair);
        }
        if (!fail && PyList_Sort(counts) < 0) fail = 1;
        if (fail) {
            Py_XDECREF(strings);
            Py_XDECREF(escaped);
            Py_XDECREF(counts);
            Py_XDECREF(cut);
            Py_XDECREF(columns);
            goto out;
        }
        result = Py_BuildValue("(niiLLnNNNNNi)", (Py_ssize_t)(resume - base), state, done, (long long)o.events,
                               (long long)o.skipped, o.rows, columns, strings, escaped, counts, cut, full);
    }
out:
    out_free(&o);
    PyBuffer_Release(&buf);
    return result;
}

/* events_start(buffer) -> (status, offset): status 0 found (offset just past the '[' of the
 * top-level "traceEvents" array, or of a bare array), 1 the buffer ends first, 2 the text does not
 * start with an object or an array, 3 the object ends without "traceEvents", 4 its first
 * "traceEvents" is not an array. Everything before is validated as JSON (Invalid otherwise); a
 * UTF-8 byte order mark is skipped. */
static PyObject *events_start(PyObject *Py_UNUSED(self), PyObject *args) {
    Py_buffer buf;
    if (!PyArg_ParseTuple(args, "y*", &buf)) return NULL;
    const char *base = buf.buf;
    Lex lex = {base, base + buf.len}, *L = &lex;
    int status = 1, r = OK;
    Py_ssize_t at = 0;
    Py_BEGIN_ALLOW_THREADS
    if (buf.len >= 3 && memcmp(base, "\xEF\xBB\xBF", 3) == 0) cur += 3;
    skip_ws(L);
    if (cur >= end_)
        status = 1;
    else if (*cur == '[') {
        status = 0;
        at = cur + 1 - base;
    } else if (*cur != '{')
        status = 2;
    else {
        cur++;
        skip_ws(L);
        if (cur < end_ && *cur == '}') {
            status = 3;
            r = -1;
        }
        while (r == OK) {
            if (cur >= end_) {
                r = NEED_MORE;
                break;
            }
            const char *kp;
            Py_ssize_t kn;
            int kesc;
            if ((r = lex_key(L, &kp, &kn, &kesc)) != OK) break;
            char decoded[16];
            if (kesc) {
                kn = unescape(kp, kn, decoded, (Py_ssize_t)sizeof decoded);
                kp = decoded;
            }
            if (kn == 11 && memcmp(kp, "traceEvents", 11) == 0) {
                status = *cur == '[' ? 0 : 4;
                at = cur + 1 - base;
                r = -1;
                break;
            }
            if ((r = skip_value(L, 2)) != OK) break;
            int more;
            if ((r = next_member(L, '}', &more)) != OK) break;
            if (!more) {
                status = 3;
                r = -1;
            }
        }
        if (r == NEED_MORE) {
            status = 1;
            r = OK;
        } else if (r == -1)
            r = OK;
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&buf);
    if (r != OK) {
        raise_outcome(r, (Py_ssize_t)(cur - base));
        return NULL;
    }
    return Py_BuildValue("(in)", status, at);
}

/* configure(fields, limits): fields are (key: str, in_args: bool, role: int) with role 0 a value,
 * 1 a time (µs, converted to ns from the text where exact), 2 the category, 3 a value read only
 * from "i" events (its columns hold one row per "i" row, in order, after the phases), 4 a value whose
 * list or object is kept as its JSON text; limits are (nesting
 * depth, string bytes, long-string bytes, long-string prefix bytes, integer digits). */
static PyObject *configure(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *fields;
    Py_ssize_t limits[5];
    if (!PyArg_ParseTuple(args, "O(nnnnn)", &fields, &limits[0], &limits[1], &limits[2], &limits[3], &limits[4]))
        return NULL;
    PyObject *seq = PySequence_Fast(fields, "fields must be a sequence");
    if (!seq) return NULL;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(seq);
    if (count < 1 || count > MAX_FIELDS) {
        Py_DECREF(seq);
        PyErr_SetString(PyExc_ValueError, "between 1 and 32 fields");
        return NULL;
    }
    FieldSpec parsed[MAX_FIELDS];
    int category = -1, n = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        const char *key;
        Py_ssize_t len;
        int in_args, role;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "s#pi", &key, &len, &in_args, &role)) break;
        char *copy = malloc((size_t)len + 1);
        if (!copy) {
            PyErr_NoMemory();
            break;
        }
        memcpy(copy, key, (size_t)len + 1);
        parsed[n++] = (FieldSpec){copy, len, in_args, role};
        if (role == ROLE_CATEGORY) category = (int)i;
    }
    Py_DECREF(seq);
    if (n != count) {
        for (int i = 0; i < n; i++) free(parsed[i].key);
        return NULL;
    }
    for (int i = 0; i < n_fields; i++) free(specs[i].key);
    memcpy(specs, parsed, sizeof(FieldSpec) * (size_t)n);
    n_fields = n;
    f_category = category;
    args_mask = 0;
    n_instant = 0;
    for (int i = 0; i < n; i++) {
        if (specs[i].in_args) args_mask |= 1U << i;
        is_time[i] = specs[i].role == ROLE_TIME;
        is_instant[i] = specs[i].role == ROLE_INSTANT;
        is_json[i] = specs[i].role == ROLE_JSON;
        n_instant += is_instant[i];
    }
    memset(key_count, 0, sizeof key_count);
    memset(key_slot, 0, sizeof key_slot);
    int bad = add_key("ph", 2, 0, KEY_PH) || add_key("args", 4, 0, KEY_ARGS);
    for (int i = 0; i < n; i++) bad = bad || add_key(specs[i].key, specs[i].len, specs[i].in_args, i);
    if (bad) {
        n_fields = 0;
        PyErr_SetString(PyExc_ValueError, "keys of 1 to 32 bytes, at most 8 of one length");
        return NULL;
    }
    max_depth = limits[0];
    max_string = limits[1];
    cut_string = limits[2];
    cut_prefix = limits[3];
    max_int_digits = limits[4];
    Py_RETURN_NONE;
}

/* --- Mapped files cut short while they are read ------------------------------------------------
 *
 * A file mapped read-only that another process truncates (a training run that writes its trace
 * again while it is analyzed) makes every read of a page past the new end a SIGBUS, which ends the
 * process without a word. guard(buffer) registers a mapping's address range (one guard per
 * mapping): a SIGBUS the kernel raises for an address inside a registered range has that page
 * replaced by a page of zeros and counted, so the read goes on (the scanner then meets a NUL byte,
 * which is never valid JSON) and the loader, asking faults(buffer), says in one line that the file
 * could not be read whole. Any other SIGBUS puts back the handler that was there before and lets
 * it have the signal (by default the process ends, as it did). unguard(token) forgets a range once
 * its mapping is gone (slot(buffer) finds its token); a new mapping over a range still registered proves
 * that range's mapping gone, and takes its slot. Each guard() puts the handler back on top if
 * something replaced it since (faulthandler enabled or disabled meanwhile). Registering is done
 * with the GIL; the handler only reads the table (a slot's start is published last and withdrawn
 * first). Elsewhere than POSIX nothing is registered. */
#if defined(__unix__) || defined(__APPLE__)
#include <errno.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>
#define HAVE_GUARDS 1
#ifndef MAP_ANONYMOUS
#define MAP_ANONYMOUS MAP_ANON
#endif

#define MAX_GUARDS 64
typedef struct {
    uintptr_t start, end;
    long faults, token;
} Guard;
static Guard guards[MAX_GUARDS];
/* Each guard's token: its slot plus MAX_GUARDS times a count of guards made, so that a late
 * unguard of a mapping long gone never forgets the slot's next range. */
static long guards_made = 0;
static struct sigaction previous_bus;
static uintptr_t page_bytes = 4096;

static void on_bus(int sig, siginfo_t *info, void *context) {
    (void)context;
    int saved = errno;
    uintptr_t at = (uintptr_t)info->si_addr;
    if (info->si_code > 0) { /* raised by the kernel for an access, not sent by a process */
        for (int i = 0; i < MAX_GUARDS; i++) {
            uintptr_t start = __atomic_load_n(&guards[i].start, __ATOMIC_ACQUIRE);
            if (start && start <= at && at < __atomic_load_n(&guards[i].end, __ATOMIC_ACQUIRE)) {
                void *page = (void *)(at - at % page_bytes);
                if (mmap(page, page_bytes, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) != MAP_FAILED) {
                    __atomic_add_fetch(&guards[i].faults, 1, __ATOMIC_RELAXED);
                    errno = saved;
                    return;
                }
                break;
            }
        }
    }
    /* Not a page of a guarded mapping: the handler from before gets it. A fault repeats on return
     * and reaches it; a signal sent by a process is sent again (blocked until this returns). */
    sigaction(SIGBUS, &previous_bus, NULL);
    if (info->si_code <= 0) raise(sig);
    errno = saved;
}

/* Put on_bus on top of whatever handles SIGBUS now (remembered for the signals not ours). */
static int install_bus_handler(void) {
    struct sigaction current;
    if (sigaction(SIGBUS, NULL, &current) != 0) return -1;
    if ((current.sa_flags & SA_SIGINFO) && current.sa_sigaction == on_bus) return 0;
    long size = sysconf(_SC_PAGESIZE);
    if (size > 0) page_bytes = (uintptr_t)size;
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_sigaction = on_bus;
    action.sa_flags = SA_SIGINFO;
    sigemptyset(&action.sa_mask);
    previous_bus = current;
    return sigaction(SIGBUS, &action, NULL);
}

/* The slot of the range [start, end), or -1. */
static int guard_slot(uintptr_t start, uintptr_t end) {
    for (int i = 0; i < MAX_GUARDS; i++)
        if (guards[i].start == start && guards[i].end == end && start) return i;
    return -1;
}

static void forget(int slot) {
    __atomic_store_n(&guards[slot].start, (uintptr_t)0, __ATOMIC_RELEASE);
    __atomic_store_n(&guards[slot].end, (uintptr_t)0, __ATOMIC_RELEASE);
}
#endif

/* The address range of a buffer (a mapping), through the buffer protocol, released at once. */
static int buffer_range(PyObject *object, uintptr_t *start, uintptr_t *end) {
    Py_buffer buf;
    if (PyObject_GetBuffer(object, &buf, PyBUF_SIMPLE) < 0) return -1;
    *start = (uintptr_t)buf.buf;
    *end = *start + (uintptr_t)buf.len;
    PyBuffer_Release(&buf);
    return 0;
}

/* guard(buffer) -> token: see above; -1 where nothing can be guarded (an empty buffer, a full
 * table, no SIGBUS handler could be set, not POSIX). */
static PyObject *guard(PyObject *Py_UNUSED(self), PyObject *object) {
    uintptr_t start, end;
    if (buffer_range(object, &start, &end) < 0) return NULL;
#ifdef HAVE_GUARDS
    if (start == 0 || end <= start || install_bus_handler() < 0) return PyLong_FromLong(-1);
    int free_slot = -1;
    for (int i = 0; i < MAX_GUARDS; i++) {
        uintptr_t s = guards[i].start;
        if (s && s < end && start < guards[i].end) forget(i); /* its mapping is gone: this one is there */
        if (!guards[i].start && free_slot < 0) free_slot = i;
    }
    if (free_slot >= 0) {
        guards[free_slot].faults = 0;
        guards[free_slot].token = free_slot + MAX_GUARDS * (++guards_made % (LONG_MAX / (2 * MAX_GUARDS)));
        __atomic_store_n(&guards[free_slot].end, end, __ATOMIC_RELEASE);
        __atomic_store_n(&guards[free_slot].start, start, __ATOMIC_RELEASE);
        return PyLong_FromLong(guards[free_slot].token);
    }
#endif
    return PyLong_FromLong(-1);
}

/* slot(buffer) -> the token of the buffer's guarded range, or -1. */
static PyObject *slot_of(PyObject *Py_UNUSED(self), PyObject *object) {
    uintptr_t start, end;
    if (buffer_range(object, &start, &end) < 0) return NULL;
#ifdef HAVE_GUARDS
    int slot = guard_slot(start, end);
    return PyLong_FromLong(slot < 0 ? -1 : guards[slot].token);
#else
    return PyLong_FromLong(-1);
#endif
}

/* unguard(token): the range it was given for forgotten (nothing if its slot holds another now). */
static PyObject *unguard(PyObject *Py_UNUSED(self), PyObject *arg) {
    long token = PyLong_AsLong(arg);
    if (token == -1 && PyErr_Occurred()) return NULL;
#ifdef HAVE_GUARDS
    if (token >= 0 && guards[token % MAX_GUARDS].start && guards[token % MAX_GUARDS].token == token)
        forget((int)(token % MAX_GUARDS));
#endif
    Py_RETURN_NONE;
}

/* faults(buffer) -> pages of the buffer's guarded range that were replaced by zeros (0 when the
 * range is not guarded). */
static PyObject *faults(PyObject *Py_UNUSED(self), PyObject *object) {
    uintptr_t start, end;
    if (buffer_range(object, &start, &end) < 0) return NULL;
    long count = 0;
#ifdef HAVE_GUARDS
    int slot = guard_slot(start, end);
    if (slot >= 0) count = __atomic_load_n(&guards[slot].faults, __ATOMIC_RELAXED);
#endif
    return PyLong_FromLong(count);
}

static PyMethodDef methods[] = {
    {"configure", configure, METH_VARARGS, "Set the fields and limits (once, before scanning)."},
    {"scan", scan, METH_VARARGS, "Scan complete events of a traceEvents array (see the module)."},
    {"events_start", events_start, METH_VARARGS, "Where the traceEvents array starts."},
    {"guard", guard, METH_O, "Guard a mapping's pages against the file being cut short (see above)."},
    {"slot", slot_of, METH_O, "The slot of a guarded mapping, or -1."},
    {"unguard", unguard, METH_O, "Forget a guarded range (its slot)."},
    {"faults", faults, METH_O, "Pages of a guarded mapping replaced by zeros."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_scan", "Native scanner of trace events.", -1,
                                    methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__scan(void) {
    if (PyType_Ready(&BlockType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    Invalid = PyErr_NewException("traceinsight.load._scan.Invalid", PyExc_ValueError, NULL);
    if (!Invalid || PyModule_AddObject(m, "Invalid", Invalid) < 0) return NULL;
    Py_INCREF(Invalid);
    return m;
}
