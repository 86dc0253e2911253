/* traceinsight.analysis._replay: the replay's walk over a window's host points (optional; see
 * replay.py, whose Python and numpy code computes the same without it).
 *
 * walk(order, lane_start, lane_slot, queued, length, ahead, launch, uptos, cuts, point, kind,
 *      value, extra, recorded_end, removed, floor, skipped, frontier, present, starts, ends, queue)
 * replays a window's GPU work between its host points, as replay.py's loop does, and returns the
 * host's shift at the end (ns). All arguments but ``queue`` are C-contiguous buffers: int64 but
 * ``skipped`` and ``present`` (uint8).
 *
 * - Work: rows 0..n-1 in launch order; ``queued``, ``length``, ``ahead`` per row (read),
 *   ``starts``, ``ends`` per row (written); ``launch`` per row (the launch queue reads it).
 * - Lanes (a stream each): lane l's rows in launch order are order[lane_start[l] ..
 *   lane_start[l + 1]); its stream's slot is lane_slot[l]. cuts[l * A + a] is how many of its rows
 *   come before host point a's batch ends.
 * - Host points a = 0..A-1, in time order: uptos[a] (the launches before it), point[a], kind[a]
 *   (0 a blocking call, 1 a shortened range, 2 the window's end), value[a] (a range's time
 *   removed), extra[a] (a call's overhead after the GPU finished), recorded_end[a], removed[a] (the
 *   fix removes the call's wait), floor[a] (what a removed call takes), skipped[a * S + s] (the
 *   call did not wait for slot s).
 * - Slots s = 0..S-1, one per stream: frontier[s] and present[s] (read and written): where the
 *   stream is busy until, and whether it has been (a stream not present has no frontier yet).
 *
 * Sums wrap as numpy's do (no undefined overflow); every index is checked against its array, and
 * one out of range is a ValueError, never a read or write outside it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* A stream's frontier before any work: replay.py's _NEVER. */
#define NEVER (INT64_MIN / 4)

static int64_t wrap_add(int64_t a, int64_t b) { return (int64_t)((uint64_t)a + (uint64_t)b); }
static int64_t wrap_sub(int64_t a, int64_t b) { return (int64_t)((uint64_t)a - (uint64_t)b); }

enum { ORDER, LANE_START, LANE_SLOT, QUEUED, LENGTH, AHEAD, LAUNCH, UPTOS, CUTS, POINT, KIND, VALUE, EXTRA,
       RECORDED_END, REMOVED, FLOOR, SKIPPED, FRONTIER, PRESENT, STARTS, ENDS, BUFFERS };

static const char *const NAMES[BUFFERS] = {
    "order", "lane_start", "lane_slot", "queued", "length", "ahead", "launch", "uptos", "cuts", "point", "kind",
    "value", "extra", "recorded_end", "removed", "floor", "skipped", "frontier", "present", "starts", "ends"};

static int is_bytes(int which) { return which == SKIPPED || which == PRESENT; }
static int is_written(int which) { return which == FRONTIER || which == PRESENT || which == STARTS || which == ENDS; }

/* A C-contiguous buffer of int64 values (uint8 for the flags), writable when written; its length
 * in values in *n. */
static int view_of(PyObject *object, int which, Py_buffer *view, Py_ssize_t *n) {
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (is_written(which) ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(object, view, flags) < 0) return -1;
    const char *format = view->format ? view->format : "B";
    if (*format == '<' || *format == '=' || *format == '@') format++;
    int ok = is_bytes(which) ? view->itemsize == 1 && (strcmp(format, "B") == 0 || strcmp(format, "?") == 0)
                             : view->itemsize == 8 && (strcmp(format, "q") == 0 || strcmp(format, "l") == 0);
    if (!ok) {
        PyBuffer_Release(view);
        PyErr_Format(PyExc_ValueError, "walk: %s: expected %s values", NAMES[which], is_bytes(which) ? "uint8" : "int64");
        return -1;
    }
    *n = view->len / view->itemsize;
    return 0;
}

static int out_of_range(const char *what) {
    PyErr_Format(PyExc_ValueError, "walk: %s out of range", what);
    return -1;
}

static int run(Py_buffer *views, const Py_ssize_t *sizes, Py_ssize_t queue, int64_t *shift_out) {
    const int64_t *order = views[ORDER].buf, *lane_start = views[LANE_START].buf, *lane_slot = views[LANE_SLOT].buf;
    const int64_t *queued = views[QUEUED].buf, *length = views[LENGTH].buf, *ahead = views[AHEAD].buf;
    const int64_t *launch = views[LAUNCH].buf, *uptos = views[UPTOS].buf, *cuts = views[CUTS].buf;
    const int64_t *point = views[POINT].buf, *kind = views[KIND].buf, *value = views[VALUE].buf;
    const int64_t *extra = views[EXTRA].buf, *recorded_end = views[RECORDED_END].buf, *floor = views[FLOOR].buf;
    const int64_t *removed = views[REMOVED].buf;
    const uint8_t *skipped = views[SKIPPED].buf;
    int64_t *frontier = views[FRONTIER].buf, *starts = views[STARTS].buf, *ends = views[ENDS].buf;
    uint8_t *present = views[PRESENT].buf;

    Py_ssize_t rows = sizes[QUEUED], lanes = sizes[LANE_SLOT], points = sizes[UPTOS], slots = sizes[FRONTIER];
    if (sizes[LENGTH] != rows || sizes[AHEAD] != rows || sizes[LAUNCH] != rows || sizes[STARTS] != rows ||
        sizes[ENDS] != rows || sizes[ORDER] != rows)
        return out_of_range("rows");
    if (sizes[LANE_START] != lanes + 1 || sizes[CUTS] != lanes * points) return out_of_range("lanes");
    if (sizes[POINT] != points || sizes[KIND] != points || sizes[VALUE] != points || sizes[EXTRA] != points ||
        sizes[RECORDED_END] != points || sizes[REMOVED] != points || sizes[FLOOR] != points ||
        sizes[SKIPPED] != points * slots)
        return out_of_range("host points");
    if (sizes[PRESENT] != slots || queue < 0) return out_of_range("slots");
    for (Py_ssize_t l = 0; l < lanes; l++) {
        if (lane_slot[l] < 0 || lane_slot[l] >= slots || lane_start[l] < 0 || lane_start[l + 1] < lane_start[l] ||
            lane_start[l + 1] > rows)
            return out_of_range("lane");
        for (Py_ssize_t a = 0; a < points; a++) {
            int64_t cut = cuts[l * points + a];
            if (cut < 0 || cut > lane_start[l + 1] - lane_start[l] || (a && cut < cuts[l * points + a - 1]))
                return out_of_range("cut");
        }
    }
    for (Py_ssize_t i = 0; i < rows; i++)
        if (order[i] < 0 || order[i] >= rows) return out_of_range("row");
    for (Py_ssize_t a = 0; a < points; a++)
        if (uptos[a] < 0 || uptos[a] > rows) return out_of_range("launches before a host point");

    int64_t *done_to = PyMem_Calloc((size_t)(lanes ? lanes : 1), sizeof(int64_t));
    if (!done_to) {
        PyErr_NoMemory();
        return -1;
    }
    int64_t shift = 0, processed = 0;
    for (Py_ssize_t a = 0; a < points; a++) {
        int64_t upto = uptos[a];
        if (upto > processed) {
            for (Py_ssize_t l = 0; l < lanes; l++) {
                int64_t low = done_to[l], high = cuts[l * points + a];
                if (high == low) continue;
                int64_t slot = lane_slot[l];
                int64_t front = present[slot] ? frontier[slot] : NEVER;
                const int64_t *mine = order + lane_start[l];
                for (int64_t at = low; at < high; at++) {
                    int64_t row = mine[at];
                    int64_t by_queue = wrap_add(wrap_add(queued[row], shift), length[row]);
                    int64_t by_frontier = wrap_add(front, ahead[row]);
                    int64_t end = by_queue > by_frontier ? by_queue : by_frontier;
                    ends[row] = end;
                    starts[row] = wrap_sub(end, length[row]);
                    if (end > front) front = end;
                }
                frontier[slot] = front;
                present[slot] = 1;
                done_to[l] = high;
            }
            /* The launch queue: launch i cannot return before work i - queue has started. */
            int64_t first_held = processed > (int64_t)queue ? processed : (int64_t)queue;
            if (upto > first_held) {
                int64_t late = wrap_sub(starts[first_held - queue], launch[first_held]);
                for (int64_t at = first_held + 1; at < upto; at++) {
                    int64_t one = wrap_sub(starts[at - queue], launch[at]);
                    if (one > late) late = one;
                }
                int64_t over = wrap_sub(late, shift);
                if (over > 0) shift = wrap_add(shift, over);
            }
            processed = upto;
        }
        if (kind[a] == 0) {
            int64_t call_start = wrap_add(point[a], shift), returned;
            if (removed[a]) {
                returned = wrap_add(call_start, floor[a]);
            } else {
                int64_t done = 0;
                int any = 0;
                for (Py_ssize_t s = 0; s < slots; s++) {
                    if (!present[s] || skipped[a * slots + s]) continue;
                    if (!any || frontier[s] > done) done = frontier[s];
                    any = 1;
                }
                returned = wrap_add(call_start > done ? call_start : done, extra[a]);
            }
            shift = wrap_sub(returned, recorded_end[a]);
        } else if (kind[a] == 1) {
            shift = wrap_sub(shift, value[a]);
        }
    }
    PyMem_Free(done_to);
    *shift_out = shift;
    return 0;
}

static PyObject *walk(PyObject *module, PyObject *args) {
    PyObject *objects[BUFFERS];
    Py_ssize_t queue;
    if (!PyArg_ParseTuple(args, "OOOOOOOOOOOOOOOOOOOOOn", &objects[0], &objects[1], &objects[2], &objects[3],
                          &objects[4], &objects[5], &objects[6], &objects[7], &objects[8], &objects[9], &objects[10],
                          &objects[11], &objects[12], &objects[13], &objects[14], &objects[15], &objects[16],
                          &objects[17], &objects[18], &objects[19], &objects[20], &queue))
        return NULL;
    Py_buffer views[BUFFERS];
    Py_ssize_t sizes[BUFFERS];
    int got = 0;
    PyObject *result = NULL;
    for (; got < BUFFERS; got++)
        if (view_of(objects[got], got, &views[got], &sizes[got]) < 0) goto done;
    int64_t shift;
    if (run(views, sizes, queue, &shift) == 0) result = PyLong_FromLongLong(shift);
done:
    for (int i = 0; i < got; i++) PyBuffer_Release(&views[i]);
    return result;
}

static PyMethodDef methods[] = {
    {"walk", walk, METH_VARARGS, "Replay a window's work between its host points; returns the host's shift."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_replay", NULL, -1, methods};

PyMODINIT_FUNC PyInit__replay(void) { return PyModule_Create(&module_def); }
