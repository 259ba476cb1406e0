/* The record codec's per-record loops in C (docs/format.md, "On disk"; docs/performance.md).
 *
 * dledger.entry keeps the pure-Python versions and calls these when the extension is built
 * (it is optional: a machine without a compiler gets the Python loops, which CI also tests
 * against these, byte for byte). Both functions do exactly what their Python twins do:
 *
 *   encode_run(bodies, start, stop, index, term, pos, prev_chain, magic)
 *       -> (records: bytes, units: bytes, positions: bytes of native int64, chain: int)
 *   scan_run(buf, start, end, index, pos, prev_chain, term_floor, units, max_count)
 *       -> (offset, count, chain, term_floor)
 *
 * and store.columnar's check of a stretch for a columnar READ (check_columns, body_ends), and
 * spark.files' read of a data file's entries (scan_entries).
 *
 * scan_run walks only the common case: records whose every rule holds and whose CRCs are
 * checked (not upstream's unverified ones). It stops before the first record that is anything
 * else and leaves it to entry.scan's Python loop, which decides what it is (end, blank, zero,
 * a fault and its reason, an upstream record). So the rules' wording lives in one place.
 *
 * The GIL is held throughout: a call covers one push or one append (microseconds to a
 * millisecond), and giving the GIL away in the event loop's thread could make it wait a whole
 * switch interval for a flusher thread to hand it back.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <zlib.h>

#define HEADER_SIZE 48
#define UNIT_SIZE 32

static uint32_t ld32(const unsigned char *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3];
}

static uint64_t ld64(const unsigned char *p) { return ((uint64_t)ld32(p) << 32) | (uint64_t)ld32(p + 4); }

static void st32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

static void st64(unsigned char *p, uint64_t v) {
    st32(p, (uint32_t)(v >> 32));
    st32(p + 4, (uint32_t)v);
}

/* chain_crc(i) = crc32(pack(">qqI", index, term, body_crc), chain_crc(i-1)) */
static uint32_t chain_next(int64_t index, int64_t term, uint32_t body_crc, uint32_t prev) {
    unsigned char b[20];
    st64(b, (uint64_t)index);
    st64(b + 8, (uint64_t)term);
    st32(b + 16, body_crc);
    return (uint32_t)crc32(prev, b, 20);
}

/* zlib's crc32 takes a uInt length: feed it in pieces that fit */
static uint32_t body_crc32(const unsigned char *p, Py_ssize_t n) {
    uLong c = crc32(0L, Z_NULL, 0);
    while (n > 0) {
        uInt part = n > (Py_ssize_t)0x40000000 ? 0x40000000u : (uInt)n;
        c = crc32(c, p, part);
        p += part;
        n -= part;
    }
    return (uint32_t)c;
}

static int is_entry_magic(int32_t m) { return m >= 1 && m <= 4; } /* entry.ENTRY_MAGICS */

/* A record header's fields (docs/format.md, "On disk"), decoded from big-endian */
typedef struct {
    int32_t magic, size, channel, bsize;
    int64_t index, term, pos;
    uint32_t chain, bcrc;
} header_t;

static header_t get_header(const unsigned char *h) {
    header_t r = {(int32_t)ld32(h), (int32_t)ld32(h + 4), (int32_t)ld32(h + 32), (int32_t)ld32(h + 44),
                  (int64_t)ld64(h + 8), (int64_t)ld64(h + 16), (int64_t)ld64(h + 24), ld32(h + 36), ld32(h + 40)};
    return r;
}

/* entry.record_fault's rules, all kept (an entry's magic too): the record fits in the `room`
 * bytes from its start and is the one expected after its predecessor. The loops below call it
 * only to go on; any failure is left to the Python loop, which names the rule. */
static int header_follows(const header_t *r, Py_ssize_t room, int64_t index, int64_t pos, int64_t term_floor) {
    return is_entry_magic(r->magic) && r->bsize >= 0 && (int64_t)r->size == (int64_t)HEADER_SIZE + r->bsize &&
           r->size <= room && r->index == index && r->pos == pos && r->term >= term_floor && r->channel == 0;
}

static void put_unit(unsigned char *u, int32_t magic, int64_t pos, int32_t size, int64_t index, int64_t term) {
    st32(u, (uint32_t)magic);
    st64(u + 4, (uint64_t)pos);
    st32(u + 12, (uint32_t)size);
    st64(u + 16, (uint64_t)index);
    st64(u + 24, (uint64_t)term);
}

static PyObject *encode_run(PyObject *self, PyObject *args) {
    PyObject *bodies, *seq = NULL, *records = NULL, *units = NULL, *positions = NULL, *result = NULL;
    Py_ssize_t start, stop, n = 0, k, total = 0;
    long long index, term, pos;
    unsigned long prev_chain;
    int magic;
    Py_buffer *views = NULL;
    Py_ssize_t held = 0;

    if (!PyArg_ParseTuple(args, "OnnLLLki", &bodies, &start, &stop, &index, &term, &pos, &prev_chain, &magic))
        return NULL;
    {
        Py_ssize_t have = PySequence_Size(bodies);
        if (have < 0)
            return NULL;
        if (start < 0 || stop > have || start > stop) {
            PyErr_SetString(PyExc_IndexError, "encode_run: start/stop outside the bodies");
            return NULL;
        }
        PyObject *part = PySequence_GetSlice(bodies, start, stop);
        if (part == NULL)
            return NULL;
        seq = PySequence_Tuple(part); /* immutable and ours: a body's __buffer__ cannot change it */
        Py_DECREF(part);
        if (seq == NULL)
            return NULL;
    }
    n = PyTuple_GET_SIZE(seq);
    start = 0;
    views = PyMem_Calloc(n > 0 ? (size_t)n : 1, sizeof(Py_buffer));
    if (views == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (k = 0; k < n; k++) {
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(seq, start + k), &views[k], PyBUF_SIMPLE) < 0)
            goto done;
        held++;
        if (views[k].len > (Py_ssize_t)INT32_MAX - HEADER_SIZE) {
            PyErr_SetString(PyExc_ValueError, "encode_run: a body too large for one record");
            goto done;
        }
        total += HEADER_SIZE + views[k].len;
    }
    if (n > 0 && (index > INT64_MAX - (n - 1) || pos > INT64_MAX - (total - HEADER_SIZE - views[n - 1].len))) {
        PyErr_SetString(PyExc_OverflowError, "encode_run: an index or position past int64");
        goto done;
    }
    records = PyBytes_FromStringAndSize(NULL, total);
    units = PyBytes_FromStringAndSize(NULL, n * UNIT_SIZE);
    positions = PyBytes_FromStringAndSize(NULL, n * (Py_ssize_t)sizeof(int64_t));
    if (records == NULL || units == NULL || positions == NULL)
        goto done;
    {
        unsigned char *r = (unsigned char *)PyBytes_AS_STRING(records);
        unsigned char *u = (unsigned char *)PyBytes_AS_STRING(units);
        int64_t *at = (int64_t *)PyBytes_AS_STRING(positions);
        uint32_t chain = (uint32_t)prev_chain;
        for (k = 0; k < n; k++) {
            Py_ssize_t len = views[k].len;
            int32_t size = (int32_t)(HEADER_SIZE + len);
            uint32_t bcrc = body_crc32(views[k].buf, len);
            chain = chain_next(index, term, bcrc, chain);
            st32(r, (uint32_t)magic);
            st32(r + 4, (uint32_t)size);
            st64(r + 8, (uint64_t)index);
            st64(r + 16, (uint64_t)term);
            st64(r + 24, (uint64_t)pos);
            st32(r + 32, 0);
            st32(r + 36, chain);
            st32(r + 40, bcrc);
            st32(r + 44, (uint32_t)len);
            if (len)
                memcpy(r + HEADER_SIZE, views[k].buf, (size_t)len);
            put_unit(u, magic, pos, size, index, term);
            at[k] = pos;
            r += size;
            u += UNIT_SIZE;
            pos += size;
            index += 1;
        }
        result = Py_BuildValue("(OOOk)", records, units, positions, (unsigned long)chain);
    }
done:
    for (k = 0; k < held; k++)
        PyBuffer_Release(&views[k]);
    PyMem_Free(views);
    Py_XDECREF(records);
    Py_XDECREF(units);
    Py_XDECREF(positions);
    Py_DECREF(seq);
    return result;
}

static PyObject *scan_run(PyObject *self, PyObject *args) {
    PyObject *buf, *units;
    Py_ssize_t start, end, max_count;
    long long index, term_floor, pos;
    unsigned long prev_chain;
    Py_buffer view;

    if (!PyArg_ParseTuple(args, "OnnLLkLOn", &buf, &start, &end, &index, &pos, &prev_chain, &term_floor, &units,
                          &max_count))
        return NULL;
    if (units != Py_None && !PyByteArray_Check(units)) {
        PyErr_SetString(PyExc_TypeError, "scan_run: units must be a bytearray or None");
        return NULL;
    }
    if (PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    const unsigned char *b = view.buf;
    Py_ssize_t limit = end < view.len ? end : view.len; /* past the buffer: Python's loop says why */
    Py_ssize_t off = start;
    Py_ssize_t count = 0;
    uint32_t chain = (uint32_t)prev_chain;
    if (limit < 0 || start < 0)
        limit = 0; /* walk nothing: Python's loop says what such a start or end means */
    unsigned char *ubuf = NULL; /* the units of the records passed, written as they pass (F6) */
    Py_ssize_t ucap = 0;
    while (count != max_count && off >= 0 && off <= limit - HEADER_SIZE) {
        const unsigned char *h = b + off;
        header_t r = get_header(h);
        if (!header_follows(&r, limit - off, index, pos, term_floor))
            break;
        if (body_crc32(h + HEADER_SIZE, r.bsize) != r.bcrc)
            break;
        uint32_t next = chain_next(r.index, r.term, r.bcrc, chain);
        if (next != r.chain)
            break; /* upstream's unverified records too: Python's loop takes them */
        if (units != Py_None) {
            if (count == ucap) {
                Py_ssize_t cap = ucap ? 2 * ucap : 64;
                unsigned char *grown = PyMem_Realloc(ubuf, (size_t)cap * UNIT_SIZE);
                if (grown == NULL) {
                    PyMem_Free(ubuf);
                    PyBuffer_Release(&view);
                    return PyErr_NoMemory();
                }
                ubuf = grown;
                ucap = cap;
            }
            put_unit(ubuf + count * UNIT_SIZE, r.magic, r.pos, r.size, r.index, r.term);
        }
        chain = next;
        term_floor = r.term;
        off += r.size;
        count += 1;
        if (index == INT64_MAX || pos > INT64_MAX - r.size)
            break; /* the next index or position is past int64: Python's loop names the next record */
        pos += r.size;
        index += 1;
    }
    if (units != Py_None && count > 0) {
        Py_ssize_t have = PyByteArray_GET_SIZE(units);
        if (count > (PY_SSIZE_T_MAX - have) / UNIT_SIZE || PyByteArray_Resize(units, have + count * UNIT_SIZE) < 0) {
            if (!PyErr_Occurred())
                PyErr_NoMemory();
            PyMem_Free(ubuf);
            PyBuffer_Release(&view);
            return NULL;
        }
        memcpy(PyByteArray_AS_STRING(units) + have, ubuf, (size_t)(count * UNIT_SIZE));
    }
    PyMem_Free(ubuf);
    PyBuffer_Release(&view);
    return Py_BuildValue("(nnkL)", off, count, (unsigned long)chain, term_floor);
}

/* Big-endian index unit fields: magic i32, pos i64, size i32, index i64, term i64 */
typedef struct {
    int32_t magic, size;
    int64_t pos, index, term;
} unit_t;

static unit_t get_unit(const unsigned char *u) {
    unit_t r = {(int32_t)ld32(u), (int32_t)ld32(u + 12), (int64_t)ld64(u + 4), (int64_t)ld64(u + 16),
                (int64_t)ld64(u + 24)};
    return r;
}

/* store.columnar.check_run's rules over records first, first + 1, ... lying from the start of
 * `data`, one per index unit: 0 when all hold (n records, `kept` of them with a magic in
 * `mask`, `kept_bytes` of their bodies), -1 when any fails. */
static int check_stretch(const unsigned char *b, Py_ssize_t len, const unsigned char *units, Py_ssize_t n,
                         long long first, long long f_term, long long f_pos, int f_magic, unsigned long f_chain,
                         unsigned long f_bcrc, unsigned long mask, Py_ssize_t *kept, Py_ssize_t *kept_bytes) {
    Py_ssize_t off = 0;
    int64_t pos0 = (int64_t)ld64(units + 4);
    uint32_t prev_chain = 0;
    *kept = *kept_bytes = 0;
    for (Py_ssize_t k = 0; k < n; k++) {
        unit_t u = get_unit(units + k * UNIT_SIZE);
        if (u.size < HEADER_SIZE || (uint64_t)u.pos - (uint64_t)pos0 != (uint64_t)off || first > INT64_MAX - k || u.index != first + k || u.size > len - off)
            return -1;
        const unsigned char *h = b + off;
        int32_t magic = (int32_t)ld32(h);
        uint32_t ccrc = ld32(h + 36), bcrc = ld32(h + 40);
        int64_t term = (int64_t)ld64(h + 16);
        if (!is_entry_magic(magic) || magic != u.magic || (int32_t)ld32(h + 4) != u.size ||
            (int64_t)ld64(h + 8) != u.index || term != u.term || (int64_t)ld64(h + 24) != u.pos ||
            ld32(h + 32) != 0 || (int32_t)ld32(h + 44) != u.size - HEADER_SIZE)
            return -1;
        int upstream = ccrc == 0 && bcrc == 0; /* entry.unverified */
        if (k == 0 && (term != f_term || u.pos != f_pos || magic != f_magic || ccrc != (uint32_t)f_chain ||
                       bcrc != (uint32_t)f_bcrc))
            return -1;
        if (!upstream && body_crc32(h + HEADER_SIZE, u.size - HEADER_SIZE) != bcrc)
            return -1;
        if (k > 0 && !upstream && chain_next(u.index, term, bcrc, prev_chain) != ccrc)
            return -1;
        if (magic < 32 && (mask >> magic) & 1) {
            *kept += 1;
            *kept_bytes += u.size - HEADER_SIZE;
        }
        prev_chain = ccrc;
        off += u.size;
    }
    return 0;
}

/* check_columns(data, first, units, term, pos, magic, chain, body_crc, magic_mask, bodies, budget, take_one)
 *   -> None | (indexes, terms, positions, body_sizes, bodies, scanned, size, spent)
 * store.columnar.check_run's fast path: the int64 columns in native order, as array("q") holds them. */
static PyObject *check_columns(PyObject *self, PyObject *args) {
    PyObject *data, *result = NULL;
    Py_buffer view, uview;
    long long first, f_term, f_pos, budget;
    int f_magic, bodies, take_one;
    unsigned long f_chain, f_bcrc, mask;
    Py_ssize_t nu, n = 0, total = 0, kept, kept_bytes;

    if (!PyArg_ParseTuple(args, "OLy*LLikkkpLp", &data, &first, &uview, &f_term, &f_pos, &f_magic, &f_chain,
                          &f_bcrc, &mask, &bodies, &budget, &take_one))
        return NULL;
    if (uview.len % UNIT_SIZE) {
        PyBuffer_Release(&uview);
        PyErr_SetString(PyExc_ValueError, "check_columns: units are not whole index units");
        return NULL;
    }
    if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&uview);
        return NULL;
    }
    const unsigned char *units = uview.buf;
    nu = uview.len / UNIT_SIZE;
    if (nu == 0) {
        result = Py_None;
        Py_INCREF(result);
        goto done;
    }
    /* the records whose total size stays within the budget (the first always, with take_one) */
    while (n < nu) {
        int32_t size = (int32_t)ld32(units + n * UNIT_SIZE + 12);
        if (total + size > budget && !(n == 0 && take_one))
            break;
        if (size < HEADER_SIZE) {
            result = Py_None; /* a damaged unit: the caller's loop names it */
            Py_INCREF(result);
            goto done;
        }
        total += size;
        n++;
    }
    if (n == 0) {
        result = Py_BuildValue("(yyyyynnO)", "", "", "", "", "", (Py_ssize_t)0, (Py_ssize_t)0, Py_True);
        goto done;
    }
    if (check_stretch(view.buf, view.len, units, n, first, f_term, f_pos, f_magic, f_chain, f_bcrc, mask, &kept,
                      &kept_bytes) < 0) {
        result = Py_None;
        Py_INCREF(result);
        goto done;
    }
    {
        Py_ssize_t col = kept * (Py_ssize_t)sizeof(int64_t);
        PyObject *ix = PyBytes_FromStringAndSize(NULL, col), *tm = PyBytes_FromStringAndSize(NULL, col);
        PyObject *ps = PyBytes_FromStringAndSize(NULL, col), *bs = PyBytes_FromStringAndSize(NULL, col);
        PyObject *bd = PyBytes_FromStringAndSize(NULL, bodies ? kept_bytes : 0);
        if (ix && tm && ps && bs && bd) {
            int64_t *pi = (int64_t *)PyBytes_AS_STRING(ix), *pt = (int64_t *)PyBytes_AS_STRING(tm);
            int64_t *pp = (int64_t *)PyBytes_AS_STRING(ps), *pb = (int64_t *)PyBytes_AS_STRING(bs);
            unsigned char *out = (unsigned char *)PyBytes_AS_STRING(bd);
            const unsigned char *b = view.buf;
            Py_ssize_t off = 0;
            for (Py_ssize_t k = 0; k < n; k++) {
                unit_t u = get_unit(units + k * UNIT_SIZE);
                if (u.magic < 32 && (mask >> u.magic) & 1) {
                    Py_ssize_t body = u.size - HEADER_SIZE;
                    *pi++ = u.index;
                    *pt++ = u.term;
                    *pp++ = u.pos;
                    *pb++ = bodies ? body : 0;
                    if (bodies && body) {
                        memcpy(out, b + off + HEADER_SIZE, (size_t)body);
                        out += body;
                    }
                }
                off += u.size;
            }
            result = Py_BuildValue("(OOOOOnnO)", ix, tm, ps, bs, bd, n, total, n < nu ? Py_True : Py_False);
        }
        Py_XDECREF(ix);
        Py_XDECREF(tm);
        Py_XDECREF(ps);
        Py_XDECREF(bs);
        Py_XDECREF(bd);
    }
done:
    PyBuffer_Release(&view);
    PyBuffer_Release(&uview);
    return result;
}

/* body_ends(sizes) -> bytes: a columnar answer's little-endian int32 ends of each body in the
 * joined bodies, 0 first (sizes: native int64, as array("q") holds them) */
static PyObject *body_ends(PyObject *self, PyObject *args) {
    Py_buffer sv;
    if (!PyArg_ParseTuple(args, "y*", &sv))
        return NULL;
    Py_ssize_t n = sv.len / (Py_ssize_t)sizeof(int64_t);
    PyObject *out = PyBytes_FromStringAndSize(NULL, (n + 1) * 4);
    if (out != NULL) {
        const unsigned char *src = sv.buf;
        unsigned char *p = (unsigned char *)PyBytes_AS_STRING(out);
        uint32_t end = 0;
        for (Py_ssize_t k = 0; k <= n; k++) {
            if (k > 0) {
                int64_t s;
                memcpy(&s, src + (k - 1) * (Py_ssize_t)sizeof(int64_t), sizeof s);
                end += (uint32_t)s;
            }
            p[4 * k] = (unsigned char)end;
            p[4 * k + 1] = (unsigned char)(end >> 8);
            p[4 * k + 2] = (unsigned char)(end >> 16);
            p[4 * k + 3] = (unsigned char)(end >> 24);
        }
    }
    PyBuffer_Release(&sv);
    return out;
}

/* A growable buffer for scan_entries' outputs (written as records pass, never re-read from a
 * mapping another process may be writing) */
typedef struct {
    unsigned char *p;
    Py_ssize_t len, cap;
} grow_t;

static int grow_put(grow_t *g, const void *src, Py_ssize_t n) {
    if (g->len + n > g->cap) {
        Py_ssize_t cap = g->cap ? g->cap : 4096;
        while (cap < g->len + n)
            cap *= 2;
        unsigned char *q = PyMem_Realloc(g->p, (size_t)cap);
        if (q == NULL)
            return -1;
        g->p = q;
        g->cap = cap;
    }
    if (n)
        memcpy(g->p + g->len, src, (size_t)n);
    g->len += n;
    return 0;
}

static int grow_le64(grow_t *g, int64_t v) {
    unsigned char b[8];
    for (int k = 0; k < 8; k++)
        b[k] = (unsigned char)((uint64_t)v >> (8 * k));
    return grow_put(g, b, 8);
}

static int grow_le32(grow_t *g, uint32_t v) {
    unsigned char b[4] = {(unsigned char)v, (unsigned char)(v >> 8), (unsigned char)(v >> 16),
                          (unsigned char)(v >> 24)};
    return grow_put(g, b, 4);
}

/* scan_entries(buf, start, size, index, pos, chain, term_floor, last_index, end_pos, emit_from, term_lo,
 *              term_hi, bodies, verify_bodies, max_rows, max_bytes)
 *   -> (offset, records, chain, term_floor, last_pos, rows, indexes, terms, positions, body_ends, bodies)
 * spark.files' per-record loop over the common case, entries mode: records whose every rule holds,
 * CRCs checked where that loop checks them and matching, below last_index, end_pos and term_hi.
 * It stops before any other record (the Python loop decides what it is), after max_rows rows
 * or max_bytes of records. Rows: the passed NORMAL records with index >= emit_from and term >=
 * term_lo, as a columnar READ answer lays them out (little-endian int64 columns, int32 body
 * ends from 0, the bodies joined; no bodies without `bodies`). */
static PyObject *scan_entries(PyObject *self, PyObject *args) {
    PyObject *buf, *result = NULL;
    Py_ssize_t start, size, max_rows, max_bytes;
    long long index, pos, term_floor, last_index, end_pos, emit_from, term_lo, term_hi;
    unsigned long chain_in;
    int bodies, verify;
    Py_buffer view;
    grow_t ix = {0}, tm = {0}, ps = {0}, ends = {0}, bd = {0};

    if (!PyArg_ParseTuple(args, "OnnLLkLLLLLLppnn", &buf, &start, &size, &index, &pos, &chain_in, &term_floor,
                          &last_index, &end_pos, &emit_from, &term_lo, &term_hi, &bodies, &verify, &max_rows,
                          &max_bytes))
        return NULL;
    if (PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    const unsigned char *b = view.buf;
    Py_ssize_t limit = size < view.len ? size : view.len;
    if (limit < 0 || start < 0)
        limit = 0;
    Py_ssize_t off = start, count = 0, rows = 0;
    uint32_t chain = (uint32_t)chain_in;
    long long last_pos = -1;
    uint32_t body_end = 0;
    if (grow_le32(&ends, 0) < 0)
        goto nomem;
    while (off >= 0 && off <= limit - HEADER_SIZE && rows < max_rows && off - start < max_bytes) {
        const unsigned char *h = b + off;
        header_t r = get_header(h);
        if (!header_follows(&r, limit - off, index, pos, term_floor))
            break;
        if (index > last_index || pos >= end_pos || r.term >= term_hi || index == INT64_MAX ||
            pos > INT64_MAX - r.size)
            break;
        int row = r.index >= emit_from && r.term >= term_lo && r.magic == 1; /* emitted, MAGIC_NORMAL */
        if (chain_next(r.index, r.term, r.bcrc, chain) != r.chain)
            break; /* a soft fault, or an upstream record: the Python loop's */
        if (row && bodies) {
            if ((uint64_t)body_end + (uint64_t)r.bsize > 0x7FFFFFFFu)
                break; /* int32 offsets: this batch is full */
            /* the body is checked as copied (a live store's file may change under the mapping) */
            Py_ssize_t at = bd.len;
            if (grow_put(&bd, h + HEADER_SIZE, r.bsize) < 0)
                goto nomem;
            if (body_crc32(bd.p + at, r.bsize) != r.bcrc) {
                bd.len = at;
                break;
            }
        } else if (verify && body_crc32(h + HEADER_SIZE, r.bsize) != r.bcrc) {
            break;
        }
        if (row) {
            if (grow_le64(&ix, r.index) < 0 || grow_le64(&tm, r.term) < 0 || grow_le64(&ps, r.pos) < 0)
                goto nomem;
            if (bodies)
                body_end += (uint32_t)r.bsize;
            if (grow_le32(&ends, body_end) < 0)
                goto nomem;
            rows++;
        }
        chain = r.chain;
        term_floor = r.term;
        last_pos = r.pos;
        off += r.size;
        pos += r.size;
        index += 1;
        count += 1;
    }
    result = Py_BuildValue("(nnkLLny#y#y#y#y#)", off, count, (unsigned long)chain, term_floor, last_pos, rows,
                           ix.p ? (const char *)ix.p : "", ix.len, tm.p ? (const char *)tm.p : "", tm.len,
                           ps.p ? (const char *)ps.p : "", ps.len, (const char *)ends.p, ends.len,
                           bd.p ? (const char *)bd.p : "", bd.len);
    goto done;
nomem:
    PyErr_NoMemory();
done:
    PyMem_Free(ix.p);
    PyMem_Free(tm.p);
    PyMem_Free(ps.p);
    PyMem_Free(ends.p);
    PyMem_Free(bd.p);
    PyBuffer_Release(&view);
    return result;
}

static PyMethodDef methods[] = {
    {"encode_run", encode_run, METH_VARARGS, "entry.encode_run's loop (records, units, positions, chain)."},
    {"scan_run", scan_run, METH_VARARGS, "entry.scan's loop over the common case (offset, count, chain, term)."},
    {"check_columns", check_columns, METH_VARARGS, "store.columnar.check_run over a stretch, None on any fault."},
    {"body_ends", body_ends, METH_VARARGS, "A columnar answer's little-endian int32 body ends."},
    {"scan_entries", scan_entries, METH_VARARGS, "spark.files' per-record loop over the common case, as columns."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "dledger._records", NULL, -1, methods};

/* dledger.entry.NATIVE_VERSION: a build of an older _records.c left in place is not loaded */
#define RECORDS_VERSION 3

PyMODINIT_FUNC PyInit__records(void) {
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddIntConstant(m, "VERSION", RECORDS_VERSION) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
