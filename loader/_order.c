/* zarrfeed's epoch order (loader/order.py says what and why): Fisher-Yates from the end over 0..n-1, element
   i swapped with element j = the high 64 bits of next * (i + 1), `next` being SplitMix64's output stream from
   the order's key. order.py holds the same arithmetic in Python integers; tests/test_order.py holds the two
   equal element for element and both to stored golden orders. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

/* The high 64 bits of a * b: one instruction where the compiler has 128-bit integers, four 32-bit products
   elsewhere; the same number either way. */
static inline uint64_t mulhi(uint64_t a, uint64_t b) {
#ifdef __SIZEOF_INT128__
    return (uint64_t)(((unsigned __int128)a * b) >> 64);
#else
    uint64_t a0 = (uint32_t)a, a1 = a >> 32, b0 = (uint32_t)b, b1 = b >> 32;
    uint64_t p00 = a0 * b0, p01 = a0 * b1, p10 = a1 * b0, p11 = a1 * b1;
    uint64_t mid = (p00 >> 32) + (uint32_t)p01 + (uint32_t)p10;
    return p11 + (p01 >> 32) + (p10 >> 32) + (mid >> 32);
#endif
}

/* shuffle(a, key): the int64 array `a` put in the order of `key`, in place (on 0..n-1: the order itself). */
static PyObject *shuffle(PyObject *self, PyObject *args) {
    Py_buffer out;
    unsigned long long key;
    if (!PyArg_ParseTuple(args, "w*K", &out, &key)) return NULL;
    if (out.len % 8 || (uintptr_t)out.buf % 8) {
        PyBuffer_Release(&out);
        PyErr_SetString(PyExc_ValueError, "order: expected an aligned int64 buffer");
        return NULL;
    }
    int64_t *o = out.buf;
    Py_ssize_t n = out.len / 8;
    uint64_t state = key;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = n - 1; i >= 1; i--) {
        uint64_t z = (state += 0x9E3779B97F4A7C15ULL);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
        z ^= z >> 31;
        Py_ssize_t j = (Py_ssize_t)mulhi(z, (uint64_t)(i + 1));
        int64_t t = o[i];
        o[i] = o[j];
        o[j] = t;
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&out);
    Py_RETURN_NONE;
}

/* SplitMix64's next output from *state (the generator of shuffle, above). */
static inline uint64_t next64(uint64_t *state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static inline uint64_t gcd64(uint64_t a, uint64_t b) {
    while (b) { uint64_t t = a % b; a = b; b = t; }
    return a;
}

/* Whether k * a (k = 1..256, below s) stays at least s / (16 k) away from every multiple of s: the rows a
   block takes from a chunk, a apart, are then spread over the chunk instead of falling into a few tight runs
   (order.py, order 2). About half of the multipliers pass. */
static inline int spread(uint64_t a, uint64_t s) {
    if (s < 64) return 1;
    for (uint64_t k = 1; k <= 256 && k < s; k++) {
        uint64_t d = (k * a) % s;
        if ((s - d < d ? s - d : d) * 16 * k < s) return 0;
    }
    return 1;
}

/* strata(sizes, mults, offsets, key): for each chunk j of a window, in order, drawn from one SplitMix64 stream:
   offsets[j] = (next * s) >> 64, then up to 64 candidates mults[j] = 1 + (next * (s - 1)) >> 64, the first
   coprime to s that `spread` accepts (else the first coprime one, else 1); s = sizes[j] (s <= 1: 0 and 0). */
static PyObject *strata(PyObject *self, PyObject *args) {
    Py_buffer sz, mu, of;
    unsigned long long key;
    if (!PyArg_ParseTuple(args, "y*w*w*K", &sz, &mu, &of, &key)) return NULL;
    Py_ssize_t m = sz.len / 8;
    if (sz.len % 8 || mu.len != sz.len || of.len != sz.len) {
        PyBuffer_Release(&sz); PyBuffer_Release(&mu); PyBuffer_Release(&of);
        PyErr_SetString(PyExc_ValueError, "order: strata takes three int64 buffers of one length");
        return NULL;
    }
    const int64_t *s = sz.buf;
    int64_t *a = mu.buf, *b = of.buf;
    uint64_t state = key;
    for (Py_ssize_t j = 0; j < m; j++) {
        uint64_t n = (uint64_t)s[j];
        if (n <= 1) { a[j] = 0; b[j] = 0; continue; }
        b[j] = (int64_t)mulhi(next64(&state), n);
        uint64_t first = 0, pick = 0;
        for (int tries = 0; tries < 64 && !pick; tries++) {
            uint64_t c = 1 + mulhi(next64(&state), n - 1);
            if (gcd64(c, n) != 1) continue;
            if (!first) first = c;
            if (spread(c, n)) pick = c;
        }
        a[j] = (int64_t)(pick ? pick : (first ? first : 1));
    }
    PyBuffer_Release(&sz); PyBuffer_Release(&mu); PyBuffer_Release(&of);
    Py_RETURN_NONE;
}

/* fill_block(out, bases, sizes, mults, offsets, t, T, key): block t of T of a window (order.py, order 2): from
   each chunk j in order, v = (t * s) / T .. ((t + 1) * s) / T - 1 as rows bases[j] + (mults[j] * v +
   offsets[j]) % s, then the whole block shuffled as `shuffle` does with `key`. `out` must be exactly as long as
   the block. */
static PyObject *fill_block(PyObject *self, PyObject *args) {
    Py_buffer ob, bb, sb, mb, fb;
    long long t, T;
    unsigned long long key;
    if (!PyArg_ParseTuple(args, "w*y*y*y*y*LLK", &ob, &bb, &sb, &mb, &fb, &t, &T, &key)) return NULL;
    Py_ssize_t m = sb.len / 8, n = ob.len / 8;
    const int64_t *base = bb.buf, *s = sb.buf, *mult = mb.buf, *off = fb.buf;
    int64_t *o = ob.buf;
    int ok = !(ob.len % 8 || sb.len % 8 || bb.len != sb.len || mb.len != sb.len || fb.len != sb.len
               || (uintptr_t)ob.buf % 8 || T < 1 || t < 0 || t >= T);
    Py_ssize_t total = 0;
    for (Py_ssize_t j = 0; ok && j < m; j++) {
        if (s[j] < 0 || s[j] >= ((int64_t)1 << 31)) ok = 0;
        else total += (Py_ssize_t)(((t + 1) * s[j]) / T - (t * s[j]) / T);
    }
    if (!ok || total != n) {
        PyBuffer_Release(&ob); PyBuffer_Release(&bb); PyBuffer_Release(&sb); PyBuffer_Release(&mb);
        PyBuffer_Release(&fb);
        PyErr_SetString(PyExc_ValueError, "order: fill_block's buffers do not match the block");
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    Py_ssize_t k = 0;
    for (Py_ssize_t j = 0; j < m; j++) {
        int64_t n_j = s[j], lo = (t * n_j) / T, hi = ((t + 1) * n_j) / T;
        if (lo == hi) continue;
        /* mult, lo, off < n_j < 2**31: the product fits in 64 bits */
        int64_t r = (int64_t)(((uint64_t)mult[j] * (uint64_t)lo + (uint64_t)off[j]) % (uint64_t)n_j);
        for (int64_t v = lo; v < hi; v++) {  /* r = (mult * v + off) % n_j, stepped by mult */
            o[k++] = base[j] + r;
            r += mult[j];
            if (r >= n_j) r -= n_j;
        }
    }
    uint64_t state = key;
    for (Py_ssize_t i = n - 1; i >= 1; i--) {
        Py_ssize_t j = (Py_ssize_t)mulhi(next64(&state), (uint64_t)(i + 1));
        int64_t tmp = o[i];
        o[i] = o[j];
        o[j] = tmp;
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&ob); PyBuffer_Release(&bb); PyBuffer_Release(&sb); PyBuffer_Release(&mb);
    PyBuffer_Release(&fb);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"shuffle", shuffle, METH_VARARGS, "shuffle(a, key): the int64 array a in the order of key, in place"},
    {"strata", strata, METH_VARARGS, "strata(sizes, mults, offsets, key): each chunk's multiplier and offset"},
    {"fill_block", fill_block, METH_VARARGS, "fill_block(out, bases, sizes, mults, offsets, t, T, key): a block"},
    {NULL, NULL, 0, NULL}};
static struct PyModuleDef mod = {PyModuleDef_HEAD_INIT, "_order", NULL, -1, methods};
PyMODINIT_FUNC PyInit__order(void) { return PyModule_Create(&mod); }
