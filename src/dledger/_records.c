/* The record codec's two per-record loops in C (docs/format.md, "On disk"; docs/performance.md).
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
    seq = PySequence_Fast(bodies, "bodies must be a sequence");
    if (seq == NULL)
        return NULL;
    if (start < 0 || stop > PySequence_Fast_GET_SIZE(seq) || start > stop) {
        PyErr_SetString(PyExc_IndexError, "encode_run: start/stop outside the bodies");
        goto done;
    }
    n = stop - start;
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
    if (start < 0)
        limit = 0; /* walk nothing: Python's loop says what such a start means */
    while (count != max_count && off <= limit - HEADER_SIZE) {
        const unsigned char *h = b + off;
        int32_t magic = (int32_t)ld32(h), size = (int32_t)ld32(h + 4), channel = (int32_t)ld32(h + 32);
        int32_t bsize = (int32_t)ld32(h + 44);
        int64_t idx = (int64_t)ld64(h + 8), term = (int64_t)ld64(h + 16), rpos = (int64_t)ld64(h + 24);
        uint32_t ccrc = ld32(h + 36), bcrc = ld32(h + 40);
        if (!is_entry_magic(magic) || bsize < 0 || size != HEADER_SIZE + bsize || size > limit - off ||
            idx != index || rpos != pos || term < term_floor || channel != 0)
            break;
        if (body_crc32(h + HEADER_SIZE, bsize) != bcrc)
            break;
        uint32_t next = chain_next(idx, term, bcrc, chain);
        if (next != ccrc)
            break; /* upstream's unverified records too: Python's loop takes them */
        chain = next;
        term_floor = term;
        off += size;
        pos += size;
        index += 1;
        count += 1;
    }
    if (units != Py_None && count > 0) {
        Py_ssize_t have = PyByteArray_GET_SIZE(units);
        if (count > (PY_SSIZE_T_MAX - have) / UNIT_SIZE || PyByteArray_Resize(units, have + count * UNIT_SIZE) < 0) {
            if (!PyErr_Occurred())
                PyErr_NoMemory();
            PyBuffer_Release(&view);
            return NULL;
        }
        unsigned char *u = (unsigned char *)PyByteArray_AS_STRING(units) + have;
        Py_ssize_t at = start;
        for (Py_ssize_t k = 0; k < count; k++) {
            const unsigned char *h = b + at;
            int32_t size = (int32_t)ld32(h + 4);
            put_unit(u, (int32_t)ld32(h), (int64_t)ld64(h + 24), size, (int64_t)ld64(h + 8), (int64_t)ld64(h + 16));
            u += UNIT_SIZE;
            at += size;
        }
    }
    PyBuffer_Release(&view);
    return Py_BuildValue("(nnkL)", off, count, (unsigned long)chain, term_floor);
}

static PyMethodDef methods[] = {
    {"encode_run", encode_run, METH_VARARGS, "entry.encode_run's loop (records, units, positions, chain)."},
    {"scan_run", scan_run, METH_VARARGS, "entry.scan's loop over the common case (offset, count, chain, term)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "dledger._records", NULL, -1, methods};

PyMODINIT_FUNC PyInit__records(void) { return PyModule_Create(&module); }
