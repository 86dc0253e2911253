/* traceinsight.analysis._nesting: direct callers and self time of host operators (optional; see
 * host.py, whose polars code computes the same without it).
 *
 * self_times(thread, ts, end, dur, parent, self) works on n operators sorted by thread, then
 * start, then end descending (all int64 arrays of n values; ``thread`` nondecreasing). It fills ``parent`` (the row of
 * each operator's direct caller, or -1) and ``self`` (its duration minus its direct callees'
 * durations, at least 0), by host.py's rule: an operator's depth is the operators of its thread
 * started before it (itself included) less those ended by its start (zero-length operators that
 * start at that instant and come at or after it in the order do not count as ended), less one;
 * its caller is the latest earlier row of its thread one level up. Operators that overlap without
 * nesting are counted as if they nested, exactly as host.py does.
 *
 * Every index stays inside the arrays whatever the input; the work is O(n log d) for d operators
 * open at once, plus an array over the range of depths, without the GIL.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>

static int int64_buffer(Py_buffer *view, Py_ssize_t n, const char *what) {
    if (view->len != n * (Py_ssize_t)sizeof(int64_t) || view->itemsize != (Py_ssize_t)sizeof(int64_t)) {
        PyErr_Format(PyExc_ValueError, "%s: expected %zd int64 values", what, n);
        return -1;
    }
    return 0;
}

/* A min-heap of ends (the operators of the current thread that may not have ended yet). */
static void heap_push(int64_t *heap, Py_ssize_t *size, int64_t value) {
    Py_ssize_t i = (*size)++;
    while (i > 0) {
        Py_ssize_t up = (i - 1) / 2;
        if (heap[up] <= value) break;
        heap[i] = heap[up];
        i = up;
    }
    heap[i] = value;
}

static void heap_pop(int64_t *heap, Py_ssize_t *size) {
    int64_t last = heap[--*size];
    Py_ssize_t i = 0, n = *size;
    for (;;) {
        Py_ssize_t child = 2 * i + 1;
        if (child >= n) break;
        if (child + 1 < n && heap[child + 1] < heap[child]) child++;
        if (heap[child] >= last) break;
        heap[i] = heap[child];
        i = child;
    }
    if (n) heap[i] = last;
}

static int walk(Py_ssize_t n, const int64_t *thread, const int64_t *ts, const int64_t *end, const int64_t *dur,
                int64_t *parent, int64_t *self) {
    if (n == 0) return 0;
    int64_t *heap = malloc((size_t)n * sizeof(int64_t));
    if (!heap) return -1;
    /* pass 1: depths (into parent), and their range. The ends at or before a run's start are
     * those of the operators started up to and including the run (a later start ends later):
     * each run's ends go on the heap, then every end <= its start comes off, counted. */
    int64_t low = 0, high = 0;
    Py_ssize_t a = 0;
    while (a < n) {
        Py_ssize_t b = a + 1;
        while (b < n && thread[b] == thread[a]) b++;
        Py_ssize_t size = 0;
        int64_t ended = 0;
        Py_ssize_t r0 = a;
        while (r0 < b) {
            Py_ssize_t r1 = r0 + 1; /* a run of one start */
            while (r1 < b && ts[r1] == ts[r0]) r1++;
            int64_t zeros = 0;
            for (Py_ssize_t i = r0; i < r1; i++) {
                zeros += end[i] == ts[i];
                heap_push(heap, &size, end[i]);
            }
            while (size && heap[0] <= ts[r0]) {
                heap_pop(heap, &size);
                ended++;
            }
            int64_t seen = 0;
            for (Py_ssize_t i = r0; i < r1; i++) {
                seen += end[i] == ts[i];
                int64_t zero_after = zeros - (seen - 1 > 0 ? seen - 1 : 0);
                int64_t depth = (int64_t)(i - a + 1) - (ended - zero_after) - 1;
                parent[i] = depth;
                if (i == 0 || depth < low) low = depth;
                if (i == 0 || depth > high) high = depth;
            }
            r0 = r1;
        }
        a = b;
    }
    free(heap);
    /* pass 2: the caller is the latest earlier row of the thread one level up */
    Py_ssize_t span = (Py_ssize_t)(high - low + 1);
    Py_ssize_t *last = malloc((size_t)span * sizeof(Py_ssize_t));
    if (!last) return -1;
    for (Py_ssize_t d = 0; d < span; d++) last[d] = -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t level = (Py_ssize_t)(parent[i] - low);
        Py_ssize_t up = level > 0 ? last[level - 1] : -1;
        if (up >= 0 && thread[up] != thread[i]) up = -1;
        last[level] = i;
        parent[i] = up;
        self[i] = dur[i];
    }
    free(last);
    /* wrapping, as polars' sums do (a signed overflow would be undefined in C) */
    for (Py_ssize_t i = 0; i < n; i++)
        if (parent[i] >= 0) self[parent[i]] = (int64_t)((uint64_t)self[parent[i]] - (uint64_t)dur[i]);
    for (Py_ssize_t i = 0; i < n; i++)
        if (self[i] < 0) self[i] = 0;
    return 0;
}

static PyObject *self_times(PyObject *Py_UNUSED(module), PyObject *args) {
    Py_buffer views[6];
    static const char *names[6] = {"thread", "ts", "end", "dur", "parent", "self"};
    if (!PyArg_ParseTuple(args, "y*y*y*y*w*w*", &views[0], &views[1], &views[2], &views[3], &views[4],
                          &views[5]))
        return NULL;
    Py_ssize_t n = views[0].len / (Py_ssize_t)sizeof(int64_t);
    int failed = 0;
    for (int i = 0; i < 6 && !failed; i++) failed = int64_buffer(&views[i], n, names[i]) < 0;
    if (!failed) {
        const int64_t *thread = views[0].buf;
        for (Py_ssize_t i = 1; i < n && !failed; i++)
            if (thread[i] < thread[i - 1]) {
                PyErr_SetString(PyExc_ValueError, "thread: must be nondecreasing");
                failed = 1;
            }
    }
    if (!failed) {
        int r;
        Py_BEGIN_ALLOW_THREADS
        r = walk(n, views[0].buf, views[1].buf, views[2].buf, views[3].buf, views[4].buf, views[5].buf);
        Py_END_ALLOW_THREADS
        if (r < 0) {
            PyErr_NoMemory();
            failed = 1;
        }
    }
    for (int i = 0; i < 6; i++) PyBuffer_Release(&views[i]);
    if (failed) return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"self_times", self_times, METH_VARARGS, "Direct callers and self times (see the module)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_nesting", "Nesting of host operators.", -1,
                                    methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__nesting(void) { return PyModule_Create(&module); }
