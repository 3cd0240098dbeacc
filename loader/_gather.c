/* The loader's inner loop: gather rows of interleaved records into per-field columns, in one pass over the rows.

   Written in C because numpy needs two passes (np.take of whole rows, then a strided copy per field: about
   90 ns per 116-byte row here) and Numba compiled the fused loop to 68-190 ns per row (per-field memcpy
   calls, or word loops it did not vectorise), plus 0.6-0.9 s of import and compilation before the first
   batch. This loop copies rows in blocks through an L1-sized buffer, each field with moves of constant size,
   prefetches rows ahead and releases the GIL. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define PREFETCH 16   /* rows ahead */
#define STAGE_ROWS 32  /* rows per block (see gather) */
#define STAGE_BYTES 8192

static inline void copy_words(char *dst, const char *src, Py_ssize_t n) {
    Py_ssize_t k = 0;
    for (; k + 8 <= n; k += 8) { uint64_t v; memcpy(&v, src + k, 8); memcpy(dst + k, &v, 8); }
    if (k + 4 <= n) { uint32_t v; memcpy(&v, src + k, 4); memcpy(dst + k, &v, 4); k += 4; }
    if (k < n) memcpy(dst + k, src + k, n - k);
}
/* Fields of up to 128 bytes (multiples of 4, and 1 or 2) are copied with a memcpy of constant size, which the
   compiler turns into a few moves; measured on 116-byte L5Kit agents, 48 instead of 59 ns per random row. */
#define C(N) case N: memcpy(dst, src, N); return;
static inline void copy_field(char *dst, const char *src, Py_ssize_t n) {
    switch (n) {
        C(1) C(2) C(4) C(8) C(12) C(16) C(20) C(24) C(28) C(32) C(36) C(40)
        C(44) C(48) C(52) C(56) C(60) C(64) C(68) C(72) C(76) C(80) C(84) C(88)
        C(92) C(96) C(100) C(104) C(108) C(112) C(116) C(120) C(124) C(128)
    default: copy_words(dst, src, n);
    }
}
#undef C

/* n rows of a field of `size` bytes, `stride` bytes apart, into a column; the common sizes as constants. */
#define L(N) case N: for (Py_ssize_t i = 0; i < n; i++) memcpy(dst + i * N, src + i * stride, N); return;
static inline void copy_column(char *dst, const char *src, Py_ssize_t stride, Py_ssize_t size, Py_ssize_t n) {
    switch (size) {
        L(1) L(2) L(4) L(8) L(12) L(16) L(24) L(32)
    default: for (Py_ssize_t i = 0; i < n; i++) copy_field(dst + i * size, src + i * stride, size);
    }
}
#undef L

/* Every cache line of a row: rows are random, in DRAM, so they are asked for some rows ahead. */
static inline void prefetch_row(const char *ahead, Py_ssize_t row_bytes) {
    for (Py_ssize_t b = 0; b < row_bytes; b += 64) __builtin_prefetch(ahead + b);
    __builtin_prefetch(ahead + row_bytes - 1);
}

/* The loop of gather, in a function of its own whose arguments are plain values (in gather their addresses
   went to PyArg_ParseTuple, so a byte stored through `o` might change them). Small changes to this loop move
   it by 10-30%: measure with bench/bench_gather.py before and after. */
static __attribute__((noinline)) void gather_rows(const char *s, Py_ssize_t row_bytes, const int64_t *r,
                                                  Py_ssize_t n, char *o, const int64_t *f, Py_ssize_t nf,
                                                  Py_ssize_t first, Py_ssize_t scale) {
    if (row_bytes <= STAGE_BYTES) {
        /* In blocks: the block's rows into a staging buffer (one constant-size copy per row, the prefetched
           DRAM reads), then each field's column from it (a tight loop per field, from L1). Measured on
           116-byte rows shuffled within a 160,000-row window of shared memory: 50 instead of 56-67 ns per row. */
        char stage[STAGE_BYTES] __attribute__((aligned(64)));
        Py_ssize_t block = STAGE_BYTES / row_bytes < STAGE_ROWS ? STAGE_BYTES / row_bytes : STAGE_ROWS;
        for (Py_ssize_t b0 = 0; b0 < n; b0 += block) {
            Py_ssize_t m = n - b0 < block ? n - b0 : block;
            for (Py_ssize_t i = 0; i < m; i++) {
                Py_ssize_t g = b0 + i;
                if (g + PREFETCH < n) prefetch_row(s + r[g + PREFETCH] * scale, row_bytes);
                copy_field(stage + i * row_bytes, s + r[g] * scale, row_bytes);
            }
            for (Py_ssize_t k = 0; k < nf; k++) {
                int64_t off = f[3 * k], size = f[3 * k + 1], base = f[3 * k + 2];
                copy_column(o + base + (first + b0) * size, stage + off, row_bytes, size, m);
            }
        }
    } else {
        for (Py_ssize_t i = 0; i < n; i++) {
            if (i + PREFETCH < n) prefetch_row(s + r[i + PREFETCH] * scale, row_bytes);
            const char *row = s + r[i] * scale;
            for (Py_ssize_t k = 0; k < nf; k++) {
                int64_t off = f[3 * k], size = f[3 * k + 1], base = f[3 * k + 2];
                copy_field(o + base + (first + i) * size, row + off, size);
            }
        }
    }
}


/* An index argument (rows, runs, fields): a C-contiguous buffer of int64, checked by its format, so that a
   float64 or int32 array is refused instead of being read as other numbers. */
static int int64_buffer(PyObject *obj, Py_buffer *view, const char *fn, const char *what, Py_ssize_t group) {
    if (PyObject_GetBuffer(obj, view, PyBUF_RECORDS_RO) < 0) return -1;
    const char *fmt = view->format ? view->format : "B";
    if (*fmt == '<' || *fmt == '=' || *fmt == '@') fmt++;
    if (view->itemsize != 8 || (strcmp(fmt, "q") != 0 && strcmp(fmt, "l") != 0) || view->len % (8 * group)
        || !PyBuffer_IsContiguous(view, 'C')) {
        PyErr_Format(PyExc_TypeError, "%s: %s must be a C-contiguous int64 array%s, got format '%s' item size %zd",
                     fn, what, group > 1 ? " of whole groups" : "", view->format ? view->format : "B", view->itemsize);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}


/* gather(src, row_bytes, rows, out, fields, first, scale): for each i, the record of row_bytes bytes at
   src + rows[i] * scale is split into fields; field k = (offset, size, base) goes to
   out[base + (first + i) * size]. scale is row_bytes when rows are row numbers, 1 when they are byte offsets. */
static PyObject *gather(PyObject *self, PyObject *args) {
    Py_buffer src, rows, out, fields;
    PyObject *rows_obj, *fields_obj;
    Py_ssize_t row_bytes, first, scale;
    if (!PyArg_ParseTuple(args, "y*nOw*Onn", &src, &row_bytes, &rows_obj, &out, &fields_obj, &first, &scale))
        return NULL;
    if (int64_buffer(rows_obj, &rows, "gather", "rows", 1) < 0) {
        PyBuffer_Release(&src); PyBuffer_Release(&out); return NULL;
    }
    if (int64_buffer(fields_obj, &fields, "gather", "fields", 3) < 0) {
        PyBuffer_Release(&src); PyBuffer_Release(&rows); PyBuffer_Release(&out); return NULL;
    }
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
    gather_rows(s, row_bytes, r, n, o, f, nf, first, scale);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&src); PyBuffer_Release(&rows); PyBuffer_Release(&out); PyBuffer_Release(&fields);
    Py_RETURN_NONE;
fail:
    PyBuffer_Release(&src); PyBuffer_Release(&rows); PyBuffer_Release(&out); PyBuffer_Release(&fields);
    return NULL;
}

/* The loop of gather_runs, for the same reason as gather_rows: with plain values as arguments the compiler
   keeps them in registers (measured: 0.75 instead of 1.1 ms for a batch of 32 L5Kit windows' agents). */
static __attribute__((noinline)) void gather_run_rows(const char *s, Py_ssize_t row_bytes, const int64_t *r,
                                                      Py_ssize_t nr, char *o, const int64_t *f, Py_ssize_t nf,
                                                      Py_ssize_t first) {
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
}

/* gather_runs(src, row_bytes, runs, out, fields, first): like gather, for runs of consecutive records:
   runs holds (byte offset in src, records) pairs, copied one after the other from output row `first` on.
   Sequential reads, no index per row: what WindowLoader needs for each sample's agents. */
static PyObject *gather_runs(PyObject *self, PyObject *args) {
    Py_buffer src, runs, out, fields;
    PyObject *runs_obj, *fields_obj;
    Py_ssize_t row_bytes, first;
    if (!PyArg_ParseTuple(args, "y*nOw*On", &src, &row_bytes, &runs_obj, &out, &fields_obj, &first)) return NULL;
    if (int64_buffer(runs_obj, &runs, "gather_runs", "runs", 2) < 0) {
        PyBuffer_Release(&src); PyBuffer_Release(&out); return NULL;
    }
    if (int64_buffer(fields_obj, &fields, "gather_runs", "fields", 3) < 0) {
        PyBuffer_Release(&src); PyBuffer_Release(&runs); PyBuffer_Release(&out); return NULL;
    }
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
    gather_run_rows(s, row_bytes, r, nr, o, f, nf, first);
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
