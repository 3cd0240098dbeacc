/* numpy's Generator.shuffle of a 1-D int64 array, bit for bit, about twice as fast.

   Each window's shuffled row order is made once per epoch: numpy spent about 20 ns per row on it (3.3 ms for
   a window of 160,000 rows, a fifth of a cached epoch's CPU); this takes 10 (measured: 9 ns of it drawing,
   mostly the rejection loop's mispredicted branches, which a branchless draw made slower; prefetching a[j]
   ahead did not help). numpy calls its bit generator through a pointer and copies each swap with memcpy
   calls; this is the same algorithm with PCG64 inlined: Fisher-Yates
   from the end, j = random_interval(i) by masked rejection on 32-bit halves of PCG64 XSL-RR outputs
   (numpy/random/src/distributions/distributions.c, numpy/random/src/pcg64/pcg64.h,
   numpy/random/_generator.pyx: _shuffle_raw). tests/test_shuffle.py holds it to numpy's own shuffle, so a
   numpy that changed its algorithm would be noticed; loader.shuffle falls back to numpy where this module
   is missing. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#ifdef __SIZEOF_INT128__
typedef unsigned __int128 u128;

typedef struct {
    u128 state, inc;
    int has_uint32;
    uint32_t uinteger;
} pcg64;

static inline uint64_t pcg64_next64(pcg64 *g) {
    const u128 mult = ((u128)2549297995355413924ULL << 64) | 4865540595714422341ULL;
    g->state = g->state * mult + g->inc;
    uint64_t v = (uint64_t)(g->state >> 64) ^ (uint64_t)g->state;
    unsigned rot = (unsigned)(g->state >> 122);
    return (v >> rot) | (v << ((-rot) & 63));
}

static inline uint32_t pcg64_next32(pcg64 *g) {
    if (g->has_uint32) {
        g->has_uint32 = 0;
        return g->uinteger;
    }
    uint64_t next = pcg64_next64(g);
    g->has_uint32 = 1;
    g->uinteger = (uint32_t)(next >> 32);
    return (uint32_t)next;
}

/* A uniform integer in [0, max], as numpy's random_interval draws it. */
static inline uint64_t random_interval(pcg64 *g, uint64_t max) {
    if (max == 0) return 0;
    uint64_t mask = max, value;
    mask |= mask >> 1; mask |= mask >> 2; mask |= mask >> 4; mask |= mask >> 8; mask |= mask >> 16; mask |= mask >> 32;
    if (max <= 0xffffffffULL) {
        while ((value = (pcg64_next32(g) & mask)) > max) {}
    } else {
        while ((value = (pcg64_next64(g) & mask)) > max) {}
    }
    return value;
}

/* shuffle(array, state_hi, state_lo, inc_hi, inc_lo, has_uint32, uinteger) -> the generator's state after it,
   as (state_hi, state_lo, has_uint32, uinteger): the int64 array is shuffled in place. */
static PyObject *shuffle(PyObject *self, PyObject *args) {
    Py_buffer buf;
    unsigned long long shi, slo, ihi, ilo, uint;
    int has;
    if (!PyArg_ParseTuple(args, "w*KKKKpK", &buf, &shi, &slo, &ihi, &ilo, &has, &uint)) return NULL;
    if (buf.len % 8 || (uintptr_t)buf.buf % 8) {
        PyBuffer_Release(&buf);
        PyErr_SetString(PyExc_ValueError, "shuffle: expected an aligned buffer of int64");
        return NULL;
    }
    pcg64 g = {((u128)shi << 64) | slo, ((u128)ihi << 64) | ilo, has, (uint32_t)uint};
    int64_t *a = buf.buf;
    Py_ssize_t n = buf.len / 8;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = n - 1; i >= 1; i--) {
        Py_ssize_t j = (Py_ssize_t)random_interval(&g, (uint64_t)i);
        int64_t t = a[j];
        a[j] = a[i];
        a[i] = t;
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&buf);
    return Py_BuildValue("KKiK", (unsigned long long)(g.state >> 64), (unsigned long long)g.state, g.has_uint32,
                         (unsigned long long)g.uinteger);
}

static PyMethodDef methods[] = {
    {"shuffle", shuffle, METH_VARARGS, "shuffle(array, state_hi, state_lo, inc_hi, inc_lo, has_uint32, uinteger)"},
    {NULL, NULL, 0, NULL}};
#else
static PyMethodDef methods[] = {{NULL, NULL, 0, NULL}};  /* no 128-bit integers: loader.shuffle uses numpy */
#endif

static struct PyModuleDef mod = {PyModuleDef_HEAD_INIT, "_shuffle", NULL, -1, methods};
PyMODINIT_FUNC PyInit__shuffle(void) { return PyModule_Create(&mod); }
