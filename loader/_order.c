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

static PyMethodDef methods[] = {
    {"shuffle", shuffle, METH_VARARGS, "shuffle(a, key): the int64 array a in the order of key, in place"},
    {NULL, NULL, 0, NULL}};
static struct PyModuleDef mod = {PyModuleDef_HEAD_INIT, "_order", NULL, -1, methods};
PyMODINIT_FUNC PyInit__order(void) { return PyModule_Create(&mod); }
