/* The loader's inner loop: gather rows of interleaved records into per-field columns, in one pass.

   Written in C because numpy needs two passes (np.take of whole rows, then a strided copy per field: about
   90 ns per 116-byte row here) and Numba compiled the fused loop to 68-190 ns per row (per-field memcpy
   calls, or word loops it did not vectorise), plus 0.6-0.9 s of import and compilation before the first
   batch. This loop copies each field with 8- or 4-byte words, prefetches rows ahead and releases the GIL:
   26-35 ns per row. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define PREFETCH 12

static inline void copy_field(char *dst, const char *src, Py_ssize_t n) {
    if ((n & 7) == 0) { uint64_t *d = (uint64_t *)dst; const uint64_t *s = (const uint64_t *)src;
        for (Py_ssize_t k = 0; k < (n >> 3); k++) { uint64_t v; memcpy(&v, s + k, 8); memcpy(d + k, &v, 8); } }
    else if ((n & 3) == 0) { for (Py_ssize_t k = 0; k < n; k += 4) { uint32_t v; memcpy(&v, src + k, 4); memcpy(dst + k, &v, 4); } }
    else memcpy(dst, src, n);
}

/* gather(src, row_bytes, rows, out, fields, first, scale): for each i, the record of row_bytes bytes at
   src + rows[i] * scale is split into fields; field k = (offset, size, base) goes to
   out[base + (first + i) * size]. scale is row_bytes when rows are row numbers, 1 when they are byte offsets. */
static PyObject *gather(PyObject *self, PyObject *args) {
    Py_buffer src, rows, out, fields;
    Py_ssize_t row_bytes, first, scale;
    if (!PyArg_ParseTuple(args, "y*ny*w*y*nn", &src, &row_bytes, &rows, &out, &fields, &first, &scale)) return NULL;
    const int64_t *r = rows.buf; Py_ssize_t n = rows.len / 8;
    const int64_t *f = fields.buf; Py_ssize_t nf = fields.len / 24;
    const char *s = src.buf; char *o = out.buf;
    if (row_bytes <= 0 || scale <= 0 || first < 0) {
        PyErr_SetString(PyExc_ValueError, "gather: row_bytes and scale must be positive, first >= 0");
        goto fail;
    }
    for (Py_ssize_t k = 0; k < nf; k++) {  /* check every bound once, so the loop below cannot write astray */
        if (f[3 * k] < 0 || f[3 * k + 1] < 0 || f[3 * k] + f[3 * k + 1] > row_bytes
            || f[3 * k + 2] < 0 || f[3 * k + 2] + (first + n) * f[3 * k + 1] > out.len) {
            PyErr_SetString(PyExc_ValueError, "gather: a field does not fit the source row or the output");
            goto fail;
        }
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (r[i] < 0 || r[i] > (src.len - row_bytes) / scale) {
            PyErr_Format(PyExc_IndexError, "gather: row %lld is outside the source", (long long)r[i]);
            goto fail;
        }
    }
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        if (i + PREFETCH < n) {  /* every cache line of a row some rows ahead: rows are random, in DRAM */
            const char *ahead = s + r[i + PREFETCH] * scale;
            for (Py_ssize_t b = 0; b < row_bytes; b += 64) __builtin_prefetch(ahead + b);
            __builtin_prefetch(ahead + row_bytes - 1);
        }
        const char *row = s + r[i] * scale;
        for (Py_ssize_t k = 0; k < nf; k++) {
            int64_t off = f[3 * k], size = f[3 * k + 1], base = f[3 * k + 2];
            copy_field(o + base + (first + i) * size, row + off, size);
        }
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&src); PyBuffer_Release(&rows); PyBuffer_Release(&out); PyBuffer_Release(&fields);
    Py_RETURN_NONE;
fail:
    PyBuffer_Release(&src); PyBuffer_Release(&rows); PyBuffer_Release(&out); PyBuffer_Release(&fields);
    return NULL;
}

/* gather_runs(src, row_bytes, runs, out, fields, first): like gather, for runs of consecutive records:
   runs holds (byte offset in src, records) pairs, copied one after the other from output row `first` on.
   Sequential reads, no index per row: what WindowLoader needs for each sample's agents. */
static PyObject *gather_runs(PyObject *self, PyObject *args) {
    Py_buffer src, runs, out, fields;
    Py_ssize_t row_bytes, first;
    if (!PyArg_ParseTuple(args, "y*ny*w*y*n", &src, &row_bytes, &runs, &out, &fields, &first)) return NULL;
    const int64_t *r = runs.buf; Py_ssize_t nr = runs.len / 16;
    const int64_t *f = fields.buf; Py_ssize_t nf = fields.len / 24;
    const char *s = src.buf; char *o = out.buf;
    Py_ssize_t total = 0;
    if (row_bytes <= 0 || first < 0) { PyErr_SetString(PyExc_ValueError, "gather_runs: bad row_bytes or first"); goto fail; }
    for (Py_ssize_t j = 0; j < nr; j++) {
        if (r[2 * j] < 0 || r[2 * j + 1] < 0 || r[2 * j] + r[2 * j + 1] * row_bytes > src.len) {
            PyErr_SetString(PyExc_IndexError, "gather_runs: a run is outside the source");
            goto fail;
        }
        total += r[2 * j + 1];
    }
    for (Py_ssize_t k = 0; k < nf; k++) {
        if (f[3 * k] < 0 || f[3 * k + 1] < 0 || f[3 * k] + f[3 * k + 1] > row_bytes
            || f[3 * k + 2] < 0 || f[3 * k + 2] + (first + total) * f[3 * k + 1] > out.len) {
            PyErr_SetString(PyExc_ValueError, "gather_runs: a field does not fit the source row or the output");
            goto fail;
        }
    }
    Py_BEGIN_ALLOW_THREADS
    Py_ssize_t i = first;
    for (Py_ssize_t j = 0; j < nr; j++) {
        const char *row = s + r[2 * j];
        for (int64_t m = 0; m < r[2 * j + 1]; m++, i++, row += row_bytes) {
            for (Py_ssize_t k = 0; k < nf; k++) {
                int64_t off = f[3 * k], size = f[3 * k + 1], base = f[3 * k + 2];
                copy_field(o + base + i * size, row + off, size);
            }
        }
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&src); PyBuffer_Release(&runs); PyBuffer_Release(&out); PyBuffer_Release(&fields);
    Py_RETURN_NONE;
fail:
    PyBuffer_Release(&src); PyBuffer_Release(&runs); PyBuffer_Release(&out); PyBuffer_Release(&fields);
    return NULL;
}

static PyMethodDef methods[] = {{"gather", gather, METH_VARARGS, "gather(src, row_bytes, rows, out, fields, first, scale): rows to columns"},
    {"gather_runs", gather_runs, METH_VARARGS,
     "gather_runs(src, row_bytes, runs, out, fields, first): runs of consecutive rows to columns"}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef mod = {PyModuleDef_HEAD_INIT, "_gather", NULL, -1, methods};
PyMODINIT_FUNC PyInit__gather(void) { return PyModule_Create(&mod); }
