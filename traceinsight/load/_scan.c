/* traceinsight.load._scan: the native event scanner of the loader (optional; see native.py).
 *
 * scan(buffer, start, final) reads the events of a trace's ``traceEvents`` array from ``buffer``,
 * beginning at ``start`` (just after the ``[`` or after an earlier event), and gives, for every
 * complete ``"ph": "X"`` event, the 15 fields the loader's tables use as columns of (kind, value):
 * kind 0 = None (missing, null, a list or an object), 1 = int (booleans are ints 0/1, as in the
 * reference decoder), 2 = float (value holds the double's bits), 3 = string (value is an index into
 * the chunk's list of distinct strings), 4 = a float time already in ns (see text_ns). It also counts every event object and its ``cat``.
 *
 * The whole text it passes over is validated as JSON (strings, escapes, UTF-8, numbers, nesting),
 * so a file this scanner accepts is one the reference decoder accepts and reads the same way.
 * Anything it does not handle exactly (NaN/Infinity, integers beyond int64, escaped keys, long
 * numbers, a non-object element, invalid JSON) raises ``Unsupported``: the caller then uses the
 * pure-Python path, which gives the same tables or the canonical error.
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

#define NFIELDS 15
enum { F_CAT, F_NAME, F_PID, F_TID, F_TS, F_DUR, F_EXT, F_EXT_LEGACY, F_CORRELATION, F_DEVICE,
       F_STREAM, F_BYTES, F_PYTHON_ID, F_PYTHON_PARENT, F_CALL_STACK };
enum { K_NONE = 0, K_INT = 1, K_FLOAT = 2, K_STR = 3, K_NS = 4 };

/* Outcomes of the scanning functions. */
enum { OK = 0, NEED_MORE = 1, BAD = 2, NOMEM = 3 };

static PyObject *Unsupported;

typedef struct {
    const char *p; /* raw bytes between the quotes (escapes kept) */
    Py_ssize_t n;
    uint64_t hash;
    int64_t count; /* events whose cat is this string */
    int64_t cat_seq; /* order in which it was first seen as a cat */
    int escaped;
} Entry;

typedef struct {
    /* distinct strings */
    Entry *entries;
    Py_ssize_t n_entries, cap_entries;
    int32_t *slots; /* open addressing: index + 1, 0 = empty */
    Py_ssize_t n_slots;
    /* columns of the X events */
    uint8_t *kinds[NFIELDS];
    int64_t *values[NFIELDS];
    Py_ssize_t rows, cap_rows;
    /* counts over every event object */
    int64_t events, other_cat, other_seq, cat_seq;
    /* where a problem was found (for messages when debugging) */
    Py_ssize_t bad_at;
    const char *why;
} Out;

typedef struct {
    uint8_t kind;
    int64_t value;
    const char *text; /* a float's digits as written */
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

/* The index of the string p[0:n] in the chunk's list, added if new; -1 when out of memory. */
static Py_ssize_t intern(Out *o, const char *p, Py_ssize_t n, int escaped) {
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
    e->hash = h;
    e->count = 0;
    e->escaped = escaped;
    o->slots[s] = (int32_t)(o->n_entries + 1);
    return o->n_entries++;
}

/* ---------------------------------------------------------------- lexing ------------------- */

#define WS(c) ((c) == ' ' || (c) == '\n' || (c) == '\r' || (c) == '\t')

static inline void skip_ws(Lex *L) {
    while (cur < end_ && WS(*cur)) cur++;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* One UTF-8 sequence starting at a byte >= 0x80 (cur points at it); strict like Python's codec. */
static int utf8_seq(Lex *L) {
    const unsigned char *s = (const unsigned char *)cur;
    unsigned char c = s[0];
    int len;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) len = 2;
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
    if (end_ - cur < len) return NEED_MORE;
    if (s[1] < lo || s[1] > hi) return BAD;
    for (int i = 2; i < len; i++)
        if (s[i] < 0x80 || s[i] > 0xBF) return BAD;
    cur += len;
    return OK;
}

/* A string; cur is at the opening quote. On OK, p and n give the raw contents and cur is past it. */
static int lex_string(Lex *L, const char **p, Py_ssize_t *n, int *escaped) {
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
        if (cur >= end_) return NEED_MORE;
        unsigned char c = (unsigned char)*cur;
        if (c == '"') {
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
            if (end_ - cur < 6) return NEED_MORE;
            for (int i = 2; i < 6; i++)
                if (hexval(cur[i]) < 0) return BAD;
            cur += 6;
        } else if (e == '"' || e == '\\' || e == '/' || e == 'b' || e == 'f' || e == 'n' || e == 'r' ||
                   e == 't') {
            cur += 2;
        } else
            return BAD;
    }
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

/* A number; cur is at '-' or a digit. Integers that fit int64 → K_INT, others → K_FLOAT.
 * Kept integers beyond int64 and very long numbers are BAD (the Python path handles them). */
static int lex_number(Lex *L, Val *v, int keep) {
    const char *s = cur;
    const char *p = cur;
    int neg = 0, is_float = 0;
    if (*p == '-') {
        neg = 1;
        p++;
    }
    if (p >= end_) return NEED_MORE;
    if (*p == '0') {
        p++;
    } else if (*p >= '1' && *p <= '9') {
        while (p < end_ && *p >= '0' && *p <= '9') p++;
    } else
        return BAD;
    if (p < end_ && *p == '.') {
        is_float = 1;
        p++;
        const char *d = p;
        while (p < end_ && *p >= '0' && *p <= '9') p++;
        if (p == d) return p >= end_ ? NEED_MORE : BAD;
    }
    if (p < end_ && (*p == 'e' || *p == 'E')) {
        is_float = 1;
        p++;
        if (p < end_ && (*p == '+' || *p == '-')) p++;
        const char *d = p;
        while (p < end_ && *p >= '0' && *p <= '9') p++;
        if (p == d) return p >= end_ ? NEED_MORE : BAD;
    }
    if (p >= end_) return NEED_MORE; /* a number is never the last byte of a chunk of events */
    Py_ssize_t len = p - s;
    if (!keep) { /* skipped: only its grammar matters (NCCL's "Comms Id" exceeds uint64) */
        cur = p;
        return OK;
    }
    if (!is_float) {
        const char *d = s + neg;
        Py_ssize_t digits = p - d;
        if (digits > 19) return BAD;
        if (digits == 19 && memcmp(d, neg ? "9223372036854775808" : "9223372036854775807", 19) > 0)
            return BAD; /* beyond int64: a Python int, left to the Python path */
        uint64_t acc = 0;
        for (const char *q = d; q < p; q++) acc = acc * 10 + (uint64_t)(*q - '0');
        v->kind = K_INT;
        v->value = neg ? (int64_t)(0 - acc) : (int64_t)acc;
    } else {
        double d;
        if (!fast_double(s, p, &d)) {
            char tmp[64];
            if (len >= (Py_ssize_t)sizeof(tmp)) return BAD;
            memcpy(tmp, s, (size_t)len);
            tmp[len] = 0;
            d = strtod(tmp, NULL); /* correctly rounded, like Python's float() */
        }
        if (d - d != 0) return BAD; /* overflow to infinity: Python keeps inf, handled there */
        v->kind = K_FLOAT;
        v->text = s;
        v->tlen = len;
        memcpy(&v->value, &d, sizeof d);
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

static int skip_container(Lex *L, int depth, char close) {
    if (depth > 512) return BAD;
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

/* Any value, validated and skipped; cur is at its first byte. */
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
        default:
            if (*cur == '-' || (*cur >= '0' && *cur <= '9')) return lex_number(L, &v, 0);
            return BAD;
    }
}

/* A value kept as a scalar (the reference's ``_scalar``): lists and objects become None. */
static int scalar(Lex *L, Val *v, const char **sp, Py_ssize_t *sn, int *sesc) {
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
            return skip_value(L, 1);
        default:
            if (*cur == '-' || (*cur >= '0' && *cur <= '9')) return lex_number(L, v, 1);
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

/* The reference's ns for a float time (``tables._float_us_to_ns``: the plain-notation text of
 * ``repr(float)``, whole × 1000 + three fraction digits, +1 when the fourth is 5 or more, signed),
 * computed from the number's own text when that text provably is ``repr``'s: it has at most 15
 * significant digits (two such decimals never round to one double), or, with 16 to 19, it is
 * the double's correctly rounded decimal of its length (ties to even, as repr) and no decimal
 * one digit shorter rounds to the same double. 0 when not proven (Python then takes the value). */
static int text_ns(const char *s, Py_ssize_t len, double d, int64_t *ns) {
    double a = fabs(d);
    if (!(a >= 1e-4 && a < 9e15)) return 0; /* repr switches to exponents; Int64 ns bound */
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
    int64_t frac = 0;
    for (int i = 0; i < 3; i++) frac = frac * 10 + (f0 + i < f1 ? f0[i] - '0' : 0);
    if (f1 - f0 > 3 && f0[3] >= '5') frac++;
    int64_t value = whole * 1000 + frac;
    *ns = neg ? -value : value;
    return 1;
}

/* ---------------------------------------------------------------- events ------------------- */

typedef struct {
    Val v;
    const char *sp;
    Py_ssize_t sn;
    int sesc;
} Field;

static int key_is(const char *p, Py_ssize_t n, const char *lit) {
    size_t m = strlen(lit);
    return (size_t)n == m && memcmp(p, lit, m) == 0;
}

/* The ``args`` object's fields we keep; others are skipped. */
static int args_field(const char *p, Py_ssize_t n) {
    switch (n) {
        case 6: return key_is(p, n, "device") ? F_DEVICE : key_is(p, n, "stream") ? F_STREAM : -1;
        case 5: return key_is(p, n, "bytes") ? F_BYTES : -1;
        case 9: return key_is(p, n, "Python id") ? F_PYTHON_ID : -1;
        case 10: return key_is(p, n, "Call stack") ? F_CALL_STACK : -1;
        case 11:
            return key_is(p, n, "External id") ? F_EXT : key_is(p, n, "correlation") ? F_CORRELATION
                 : key_is(p, n, "external id") ? F_EXT_LEGACY : -1;
        case 16: return key_is(p, n, "Python parent id") ? F_PYTHON_PARENT : -1;
        default: return -1;
    }
}

static int event_field(const char *p, Py_ssize_t n) {
    if (n == 3) return key_is(p, n, "cat") ? F_CAT : key_is(p, n, "pid") ? F_PID : key_is(p, n, "tid") ? F_TID
                     : key_is(p, n, "dur") ? F_DUR : -1;
    if (n == 4) return key_is(p, n, "name") ? F_NAME : -1;
    if (n == 2) return key_is(p, n, "ts") ? F_TS : key_is(p, n, "ph") ? 100 : -1;
    return -1;
}

/* Reads `"key": ` at cur (inside an object); the key's raw bytes in p and n. */
static int lex_key(Lex *L, const char **p, Py_ssize_t *n) {
    int esc, r;
    if (*cur != '"') return BAD;
    if ((r = lex_string(L, p, n, &esc)) != OK) return r;
    if (esc) return BAD; /* an escaped key could spell a field's name: left to the Python path */
    return lex_colon(L);
}

/* The members of an object at cur ('{'), each value into fields[] through `which`. */
static int object_fields(Lex *L, Field *fields, int (*which)(const char *, Py_ssize_t), int *ph_x, int top) {
    int r;
    cur++;
    skip_ws(L);
    if (cur >= end_) return NEED_MORE;
    if (*cur == '}') {
        cur++;
        return OK;
    }
    for (;;) {
        const char *kp;
        Py_ssize_t kn;
        if ((r = lex_key(L, &kp, &kn)) != OK) return r;
        int f = which(kp, kn);
        if (top && f < 0 && kn == 4 && key_is(kp, kn, "args")) {
            /* the last "args" wins, as in a dict: reset what an earlier one gave */
            for (int i = F_EXT; i < NFIELDS; i++) fields[i].v.kind = K_NONE;
            if (*cur == '{') {
                if ((r = object_fields(L, fields, args_field, NULL, 0)) != OK) return r;
            } else {
                if ((r = skip_value(L, 1)) != OK) return r;
            }
        } else if (f == 100) {
            Field tmp;
            if ((r = scalar(L, &tmp.v, &tmp.sp, &tmp.sn, &tmp.sesc)) != OK) return r;
            *ph_x = tmp.v.kind == K_STR && tmp.sn == 1 && tmp.sp[0] == 'X';
        } else if (f >= 0) {
            Field *fd = &fields[f];
            if ((r = scalar(L, &fd->v, &fd->sp, &fd->sn, &fd->sesc)) != OK) return r;
        } else {
            if ((r = skip_value(L, 1)) != OK) return r;
        }
        int more;
        if ((r = next_member(L, '}', &more)) != OK || !more) return r;
    }
}

static int grow_rows(Out *o) {
    Py_ssize_t cap = o->cap_rows ? o->cap_rows * 2 : 4096;
    for (int i = 0; i < NFIELDS; i++) {
        uint8_t *k = realloc(o->kinds[i], (size_t)cap);
        if (!k) return NOMEM;
        o->kinds[i] = k;
        int64_t *v = realloc(o->values[i], (size_t)cap * sizeof(int64_t));
        if (!v) return NOMEM;
        o->values[i] = v;
    }
    o->cap_rows = cap;
    return OK;
}

/* One event object at cur. */
static int event(Lex *L, Out *o) {
    Field fields[NFIELDS];
    for (int i = 0; i < NFIELDS; i++) fields[i].v.kind = K_NONE;
    int ph_x = 0;
    int r = object_fields(L, fields, event_field, &ph_x, 1);
    if (r != OK) return r;
    o->events++;
    Field *cat = &fields[F_CAT];
    Py_ssize_t cat_index = -1;
    if (cat->v.kind == K_STR) {
        cat_index = intern(o, cat->sp, cat->sn, cat->sesc);
        if (cat_index < 0) return NOMEM;
        Entry *e = &o->entries[cat_index];
        if (!e->count++) e->cat_seq = o->cat_seq++;
    } else if (!o->other_cat++)
        o->other_seq = o->cat_seq++;
    if (!ph_x) return OK;
    if (o->rows == o->cap_rows && grow_rows(o) != OK) return NOMEM;
    Py_ssize_t row = o->rows++;
    for (int i = 0; i < NFIELDS; i++) {
        Field *fd = &fields[i];
        int64_t value = fd->v.value;
        if (fd->v.kind == K_STR) {
            Py_ssize_t index = i == F_CAT ? cat_index : intern(o, fd->sp, fd->sn, fd->sesc);
            if (index < 0) return NOMEM;
            value = index;
        } else if (fd->v.kind == K_NONE)
            value = 0;
        else if (fd->v.kind == K_FLOAT && (i == F_TS || i == F_DUR)) {
            double d;
            memcpy(&d, &value, sizeof d);
            if (d == 0) { /* "0.0", "-0.0": repr's whole part is 0 */
                value = 0;
                fd->v.kind = K_NS;
            } else if (text_ns(fd->v.text, fd->v.tlen, d, &value))
                fd->v.kind = K_NS;
        }
        o->kinds[i][row] = fd->v.kind;
        o->values[i][row] = value;
    }
    return OK;
}

/* Events from cur until the array's ']' (done) or the end of the complete events. */
static int events(Lex *L, Out *o, int *done, const char **resume) {
    for (;;) {
        skip_ws(L);
        *resume = cur;
        if (cur >= end_) return OK;
        if (*cur == ']') {
            cur++;
            *done = 1;
            *resume = cur;
            return OK;
        }
        if (*cur == ',') { /* between events (a leading or doubled comma is caught below) */
            cur++;
            skip_ws(L);
            if (cur >= end_) return OK; /* resume at the comma */
            if (*cur != '{') return BAD;
        }
        if (*cur != '{') return BAD;
        const char *at = cur;
        int r = event(L, o);
        if (r == NEED_MORE) {
            cur = at;
            *resume = *resume; /* the comma (or the event) is read again with more bytes */
            return OK;
        }
        if (r != OK) return r;
        *resume = cur;
        /* after an event: ',' or ']' must follow (checked on the next turn) */
        skip_ws(L);
        if (cur < end_ && *cur != ',' && *cur != ']') return BAD;
    }
}

static void out_free(Out *o) {
    free(o->entries);
    free(o->slots);
    for (int i = 0; i < NFIELDS; i++) {
        free(o->kinds[i]);
        free(o->values[i]);
    }
}

/* scan(buffer, start, final, first) -> (resume, done, events, rows, columns, strings, escaped,
 * cat_counts): cat_counts are (first-seen order, string index or -1 for a non-string cat, events). ``first``: no event read yet (a comma may not come first). */
static PyObject *scan(PyObject *Py_UNUSED(self), PyObject *args) {
    Py_buffer buf;
    Py_ssize_t start;
    int final, first;
    if (!PyArg_ParseTuple(args, "y*npp", &buf, &start, &final, &first)) return NULL;
    if (start < 0 || start > buf.len) {
        PyBuffer_Release(&buf);
        PyErr_SetString(PyExc_ValueError, "start out of range");
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
    skip_ws(L);
    if (first && cur < end_ && *cur == ',')
        r = BAD;
    else {
        cur = base + start;
        r = grow_rows(&o);
        if (r == OK) r = events(L, &o, &done, &resume);
    }
    Py_END_ALLOW_THREADS
    PyObject *result = NULL;
    if (r == NOMEM) {
        PyErr_NoMemory();
        goto out;
    }
    if (r != OK || (final && !done)) {
        PyErr_Format(Unsupported, "not read by the native scanner at byte %zd", (Py_ssize_t)(cur - base));
        goto out;
    }
    {
        PyObject *strings = PyList_New(o.n_entries), *escaped = PyList_New(0), *counts = PyList_New(0);
        PyObject *columns = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)o.rows * NFIELDS * 9);
        if (!strings || !escaped || !counts || !columns) {
            Py_XDECREF(strings);
            Py_XDECREF(escaped);
            Py_XDECREF(counts);
            Py_XDECREF(columns);
            goto out;
        }
        char *dst = PyBytes_AS_STRING(columns);
        for (int i = 0; i < NFIELDS; i++) { /* values (int64 × rows) per field, then kinds */
            memcpy(dst, o.values[i], (size_t)o.rows * 8);
            dst += o.rows * 8;
        }
        for (int i = 0; i < NFIELDS; i++) {
            memcpy(dst, o.kinds[i], (size_t)o.rows);
            dst += o.rows;
        }
        int fail = 0;
        for (Py_ssize_t i = 0; i < o.n_entries && !fail; i++) {
            Entry *e = &o.entries[i];
            PyObject *s = PyBytes_FromStringAndSize(e->p, e->n);
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
            Py_DECREF(strings);
            Py_DECREF(escaped);
            Py_DECREF(counts);
            Py_DECREF(columns);
            goto out;
        }
        result = Py_BuildValue("(niLnNNNN)", (Py_ssize_t)(resume - base), done, (long long)o.events, o.rows,
                               columns, strings, escaped, counts);
    }
out:
    out_free(&o);
    PyBuffer_Release(&buf);
    return result;
}

/* events_start(buffer) -> offset just past the '[' of the top-level "traceEvents" array (or of a
 * bare array), -1 when the buffer ends first; Unsupported for any other shape. Everything before
 * it is validated as JSON. */
static PyObject *events_start(PyObject *Py_UNUSED(self), PyObject *args) {
    Py_buffer buf;
    if (!PyArg_ParseTuple(args, "y*", &buf)) return NULL;
    Py_ssize_t at = -2;
    const char *base = buf.buf;
    Lex lex = {base, base + buf.len}, *L = &lex;
    Py_BEGIN_ALLOW_THREADS
    skip_ws(L);
    if (cur >= end_)
        at = -1;
    else if (*cur == '[')
        at = cur + 1 - base;
    else if (*cur == '{') {
        cur++;
        int r = OK;
        skip_ws(L);
        while (r == OK) {
            if (cur >= end_) {
                r = NEED_MORE;
                break;
            }
            const char *kp;
            Py_ssize_t kn;
            if ((r = lex_key(L, &kp, &kn)) != OK) break;
            if (key_is(kp, kn, "traceEvents")) {
                if (*cur == '[') at = cur + 1 - base;
                break;
            }
            if ((r = skip_value(L, 1)) != OK) break;
            int more;
            if ((r = next_member(L, '}', &more)) != OK) break;
            if (!more) r = BAD; /* the document ends without traceEvents */
        }
        if (r == NEED_MORE) at = -1;
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&buf);
    if (at == -2) {
        PyErr_SetString(Unsupported, "no traceEvents array where the native scanner looks");
        return NULL;
    }
    return PyLong_FromSsize_t(at);
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_VARARGS, "Scan complete events of a traceEvents array (see the module)."},
    {"events_start", events_start, METH_VARARGS, "Offset of the first byte inside traceEvents."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_scan", "Native scanner of trace events.", -1,
                                    methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__scan(void) {
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    Unsupported = PyErr_NewException("traceinsight.load._scan.Unsupported", PyExc_ValueError, NULL);
    if (!Unsupported || PyModule_AddObject(m, "Unsupported", Unsupported) < 0) return NULL;
    Py_INCREF(Unsupported);
    PyModule_AddIntConstant(m, "FIELDS", NFIELDS);
    return m;
}
