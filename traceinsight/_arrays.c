/* traceinsight._arrays: a contiguous buffer of numbers handed to polars as an Arrow array, without
 * a copy (optional; see arrays.py, which hands the same array to polars' own constructor without it).
 *
 * capsules(buffer) returns the pair of PyCapsules of the Arrow PyCapsule interface ("arrow_schema",
 * "arrow_array") for a one-dimensional C-contiguous buffer of signed or unsigned integers of 1, 2,
 * 4 or 8 bytes, or of 4- or 8-byte floats, in native byte order (numpy arrays, bytes, array.array):
 * an array with no nulls whose one data buffer is the buffer's own memory. The array holds the
 * buffer (PyObject_GetBuffer) until its consumer releases it, from whichever thread: a thread with
 * the GIL lets go of it at once, one without leaves it to the main thread (a pending call, and the
 * next export), never waiting for the GIL, which Python code may hold for a switch interval. In
 * the samples' jobs every release came with the GIL (270 of 270): the other path is there so that
 * a polars worker that lets go of a column never waits. Once the interpreter is finalizing the
 * buffer is let go of unreleased rather than touch Python (a release racing the start of the
 * finalization can still reach Py_AddPendingCall, as with any extension). PyGILState_Check is the
 * test of the GIL: it says yes on every thread once a subinterpreter exists, which this package
 * never makes. Booleans (numpy's one byte each) are exported as unsigned bytes: Arrow's
 * booleans are bits.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* The Arrow C data interface's two structures, as its specification defines them. */
struct ArrowSchema {
    const char *format;
    const char *name;
    const char *metadata;
    int64_t flags;
    int64_t n_children;
    struct ArrowSchema **children;
    struct ArrowSchema *dictionary;
    void (*release)(struct ArrowSchema *);
    void *private_data;
};

struct ArrowArray {
    int64_t length;
    int64_t null_count;
    int64_t offset;
    int64_t n_buffers;
    int64_t n_children;
    const void **buffers;
    struct ArrowArray **children;
    struct ArrowArray *dictionary;
    void (*release)(struct ArrowArray *);
    void *private_data;
};

/* What an exported array owns: its two buffer pointers (validity: none; data) and the view; and,
 * once released by a thread without the GIL, its place in the list of views to let go of. */
typedef struct Held {
    const void *buffers[2];
    Py_buffer view;
    struct Held *next;
} Held;

/* The views released by threads without the GIL, let go of by the main thread: such a thread
 * never waits for the GIL (Python code may hold it for a whole switch interval). */
static PyThread_type_lock pending_lock;
static Held *pending;
static int drain_scheduled;
/* Releases left to the main thread so far (for the tests: the path is otherwise unseen). */
static unsigned long long deferred_count;

/* Let go of the pending views (with the GIL): a pending call, and before each export. */
static int drain(void *unused) {
    (void)unused;
    PyThread_acquire_lock(pending_lock, WAIT_LOCK);
    Held *list = pending;
    pending = NULL;
    drain_scheduled = 0;
    PyThread_release_lock(pending_lock);
    while (list != NULL) {
        Held *next = list->next;
        PyBuffer_Release(&list->view);
        free(list);
        list = next;
    }
    return 0;
}

static int finalizing(void) {
#if PY_VERSION_HEX >= 0x030D0000
    return Py_IsFinalizing();
#else
    return _Py_IsFinalizing();
#endif
}

static void release_schema(struct ArrowSchema *schema) { schema->release = NULL; }

static void release_array(struct ArrowArray *array) {
    Held *held = array->private_data;
    array->private_data = NULL;
    array->release = NULL;
    if (held == NULL) return;
    if (finalizing()) {
        free(held); /* the view is let go of unreleased: Python is being torn down */
    } else if (PyGILState_Check()) {
        PyBuffer_Release(&held->view);
        free(held);
    } else {
        PyThread_acquire_lock(pending_lock, WAIT_LOCK);
        held->next = pending;
        pending = held;
        deferred_count++;
        int schedule = !drain_scheduled;
        drain_scheduled = 1;
        PyThread_release_lock(pending_lock);
        /* A full queue of pending calls leaves the view for the next export's drain. */
        if (schedule && Py_AddPendingCall(drain, NULL) < 0) {
            PyThread_acquire_lock(pending_lock, WAIT_LOCK);
            drain_scheduled = 0;
            PyThread_release_lock(pending_lock);
        }
    }
}

/* A capsule's destructor: release what its consumer did not take (a consumer that took the
 * structure set its release to NULL), then free the structure. */
static void drop_schema(PyObject *capsule) {
    struct ArrowSchema *schema = PyCapsule_GetPointer(capsule, "arrow_schema");
    if (schema == NULL) {
        PyErr_Clear();
        return;
    }
    if (schema->release != NULL) schema->release(schema);
    free(schema);
}

static void drop_array(PyObject *capsule) {
    struct ArrowArray *array = PyCapsule_GetPointer(capsule, "arrow_array");
    if (array == NULL) {
        PyErr_Clear();
        return;
    }
    if (array->release != NULL) array->release(array);
    free(array);
}

/* The Arrow format of a buffer's items (NULL: not one this module exports). */
static const char *arrow_format(const Py_buffer *view) {
    const char *code = view->format == NULL ? "B" : view->format;
    if (*code == '@' || *code == '=') code++;
#if PY_LITTLE_ENDIAN
    if (*code == '<') code++;
#else
    if (*code == '>') code++;
#endif
    if (code[0] == '\0' || code[1] != '\0') return NULL;
    Py_ssize_t size = view->itemsize;
    switch (code[0]) {
        case 'b': case 'h': case 'i': case 'l': case 'q': case 'n':
            return size == 1 ? "c" : size == 2 ? "s" : size == 4 ? "i" : size == 8 ? "l" : NULL;
        case 'B': case 'H': case 'I': case 'L': case 'Q': case 'N': case '?':
            return size == 1 ? "C" : size == 2 ? "S" : size == 4 ? "I" : size == 8 ? "L" : NULL;
        case 'f':
            return size == 4 ? "f" : NULL;
        case 'd':
            return size == 8 ? "g" : NULL;
        default:
            return NULL;
    }
}

static PyObject *capsules(PyObject *self, PyObject *source) {
    (void)self;
    drain(NULL);
    Held *held = calloc(1, sizeof(Held));
    if (held == NULL) return PyErr_NoMemory();
    if (PyObject_GetBuffer(source, &held->view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        free(held);
        return NULL;
    }
    const char *format = arrow_format(&held->view);
    if (held->view.ndim > 1 || format == NULL || held->view.itemsize <= 0) {
        PyErr_Format(PyExc_TypeError, "capsules: not a flat buffer of numbers (format %s, %d dimensions)",
                     held->view.format == NULL ? "B" : held->view.format, held->view.ndim);
        PyBuffer_Release(&held->view);
        free(held);
        return NULL;
    }
    struct ArrowSchema *schema = calloc(1, sizeof(struct ArrowSchema));
    struct ArrowArray *array = calloc(1, sizeof(struct ArrowArray));
    if (schema == NULL || array == NULL) {
        free(schema);
        free(array);
        PyBuffer_Release(&held->view);
        free(held);
        return PyErr_NoMemory();
    }
    schema->format = format;
    schema->name = "";
    schema->flags = 2; /* ARROW_FLAG_NULLABLE, as polars' own arrays are */
    schema->release = release_schema;
    held->buffers[0] = NULL;
    held->buffers[1] = held->view.buf;
    array->length = held->view.len / held->view.itemsize;
    array->n_buffers = 2;
    array->buffers = held->buffers;
    array->release = release_array;
    array->private_data = held;
    PyObject *schema_capsule = PyCapsule_New(schema, "arrow_schema", drop_schema);
    if (schema_capsule == NULL) {
        free(schema);
        release_array(array);
        free(array);
        return NULL;
    }
    PyObject *array_capsule = PyCapsule_New(array, "arrow_array", drop_array);
    if (array_capsule == NULL) {
        Py_DECREF(schema_capsule);
        release_array(array);
        free(array);
        return NULL;
    }
    PyObject *pair = PyTuple_Pack(2, schema_capsule, array_capsule);
    Py_DECREF(schema_capsule);
    Py_DECREF(array_capsule);
    return pair;
}

static PyObject *deferred(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    PyThread_acquire_lock(pending_lock, WAIT_LOCK);
    unsigned long long count = deferred_count;
    PyThread_release_lock(pending_lock);
    return PyLong_FromUnsignedLongLong(count);
}

static PyMethodDef methods[] = {
    {"capsules", capsules, METH_O, "The Arrow PyCapsules of a flat buffer of numbers (see the module)."},
    {"deferred", deferred, METH_NOARGS, "How many releases were left to the main thread so far."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_arrays", "Buffers as Arrow arrays.", -1, methods};

PyMODINIT_FUNC PyInit__arrays(void) {
    pending_lock = PyThread_allocate_lock();
    if (pending_lock == NULL) return PyErr_NoMemory();
    return PyModule_Create(&module);
}
