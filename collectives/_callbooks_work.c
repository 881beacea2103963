/* Work: the result of a call made with async_op=True (collectives.Work; part of
 * collectives._callbooks, _callbooks.c says what the module is).
 *
 * A Work is one of two kinds. The general path's holds the backend's Pending and the
 * Communicator, whose _wait and _synchronize finish it under the front end's rules. A direct-
 * path call's holds what is in flight (its request, flight-recorder Entry and arrays) and
 * its books, which keep it in `in_flight` until it completes, so that a dropped Work cannot
 * free arrays that MPI still writes. Its wait polls the request through the primitives, as a
 * synchronous direct-path call does (busy for yield_after, then yielding the core); a call
 * that outlasts that poll, or that a close finds in flight (CallBooks.hand_over), is handed
 * to the backend as a Pending (books.pending) and the Work becomes a general one.
 */
#include "_callbooks.h"

typedef struct {
    PyObject_HEAD
    PyObject *comm;    /* the front end that finishes `pending`, or None */
    PyObject *pending; /* the backend's Pending, or None: nothing to wait for */
    PyObject *result;
    /* a direct-path call in flight: its books, request, entry and arrays; NULL otherwise */
    CallBooks *books;
    PyObject *request_obj, *entry, *arrays;
    unsigned long long request;
    /* the copy (or reduction) to `result` that the call asked for, made once complete
     * (whichever kind the Work is by then); copy.owner held until then, NULL: none */
    Copy copy;
} Work;

static PyObject *s_wait, *s_synchronize, *s_test, *s_done, *s_event;

static Work *work_alloc(PyObject *comm, PyObject *pending, PyObject *result)
{
    Work *w = PyObject_GC_New(Work, &WorkType);
    if (w == NULL)
        return NULL;
    Py_INCREF(comm);
    Py_INCREF(pending);
    Py_INCREF(result);
    w->comm = comm;
    w->pending = pending;
    w->result = result;
    w->books = NULL;
    w->request_obj = w->entry = w->arrays = NULL;
    w->request = 0;
    w->copy = (Copy){0};
    PyObject_GC_Track(w);
    return w;
}

/* Lets go of what the direct-path call held, and of its place in the books' in_flight. */
static int let_go(Work *w)
{
    CallBooks *b = w->books;
    w->books = NULL;
    Py_CLEAR(w->request_obj);
    Py_CLEAR(w->entry);
    Py_CLEAR(w->arrays);
    int rc = b->in_flight == NULL ? 0 : PySet_Discard(b->in_flight, (PyObject *)w);
    Py_DECREF(b);
    return rc < 0 ? -1 : 0;
}

/* The copy (or reduction) the call asked for, made once it has completed (once): 0, or -1
 * with an error set. */
static int copied(Work *w)
{
    if (w->copy.owner == NULL)
        return 0;
    int rc = make_copy(&w->copy);
    Py_CLEAR(w->copy.owner);
    return rc;
}

/* The direct-path call has completed: its result where it belongs, its entry's end, and its
 * arrays let go. */
static int completed(Work *w)
{
    int rc = copied(w);
    ((Entry *)w->entry)->end = now();
    return let_go(w) < 0 || rc < 0 ? -1 : 0;
}

/* The direct-path call, still in flight, as the backend's Pending (in its entry's place in
 * the recorder, and in the backend's own calls in flight); the Work becomes a general one. */
static int hand_over(Work *w)
{
    CallBooks *b = w->books;
    if (b->pending == NULL || b->front == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "a Work's books were cleared while it was in flight");
        return -1;
    }
    PyObject *pending = PyObject_CallFunctionObjArgs(b->pending, w->request_obj, w->entry,
                                                     w->arrays, NULL);
    if (pending == NULL)
        return -1;
    Py_SETREF(w->pending, pending);
    Py_INCREF(b->front);
    Py_SETREF(w->comm, b->front);
    return let_go(w);
}

/* Polls the direct-path call for `yield_after` (below 0: once): 1 complete, 0 not yet, -1
 * an error set (an MPI error: handed over first, then raised as the front end's error). */
static int poll_direct(Work *w, double yield_after)
{
    Py_INCREF(w); /* let_go may drop the books' reference, the last one besides the caller's */
    int done = poll_call(yield_after, &w->request_obj, &w->request);
    if (done > 0 && completed(w) < 0)
        done = -1;
    else if (done < 0 && PyErr_ExceptionMatches(mpi_exception)) {
        /* the call was posted: its entry stays, never completed, and its arrays with MPI */
        CallBooks *b = w->books;
        PyObject *call = ((Entry *)w->entry)->call;
        Py_INCREF(b);
        Py_INCREF(call);
        PyObject *type, *value, *traceback;
        PyErr_Fetch(&type, &value, &traceback);
        int handed = hand_over(w);
        PyErr_Restore(type, value, traceback);
        if (handed == 0)
            raise_mpi_error(b, call);
        Py_DECREF(b);
        Py_DECREF(call);
    }
    Py_DECREF(w);
    return done;
}

/* wait() and synchronize(): the direct path's poll, then the front end's `how` if needed. */
static PyObject *finish(Work *w, PyObject *how)
{
    if (w->books != NULL) {
        int done = poll_direct(w, w->books->yield_after);
        if (done < 0)
            return NULL;
        if (done == 0 && hand_over(w) < 0)
            return NULL;
    }
    if (w->pending != Py_None) {
        PyObject *d = PyObject_GetAttr(w->pending, s_done);
        int done = d == NULL ? -1 : PyObject_IsTrue(d);
        Py_XDECREF(d);
        if (done < 0)
            return NULL;
        if (!done) {
            PyObject *r = PyObject_CallMethodOneArg(w->comm, how, w->pending);
            if (r == NULL)
                return NULL;
            Py_DECREF(r);
        }
    }
    if (copied(w) < 0)
        return NULL;
    Py_INCREF(w->result);
    return w->result;
}

static PyObject *Work_wait(Work *w, PyObject *unused)
{
    (void)unused;
    return finish(w, s_wait);
}

static PyObject *Work_synchronize(Work *w, PyObject *unused)
{
    (void)unused;
    return finish(w, s_synchronize);
}

/* 1 complete, 0 not yet, -1 an error set; never blocks. */
static int is_completed(Work *w)
{
    if (w->books != NULL)
        return poll_direct(w, -1.0);
    if (w->pending == Py_None)
        return 1;
    PyObject *d = PyObject_GetAttr(w->pending, s_done);
    int done = d == NULL ? -1 : PyObject_IsTrue(d);
    Py_XDECREF(d);
    if (done != 0)
        return done;
    PyObject *r = PyObject_CallMethodNoArgs(w->pending, s_test);
    done = r == NULL ? -1 : PyObject_IsTrue(r);
    Py_XDECREF(r);
    if (done > 0 && copied(w) < 0)
        return -1;
    return done;
}

static PyObject *Work_is_completed(Work *w, PyObject *unused)
{
    (void)unused;
    int done = is_completed(w);
    return done < 0 ? NULL : PyBool_FromLong(done);
}

static PyObject *Work_get_event(Work *w, void *unused)
{
    (void)unused;
    if (w->pending == Py_None)
        Py_RETURN_NONE;
    PyObject *event = PyObject_GetAttr(w->pending, s_event);
    if (event == NULL && PyErr_ExceptionMatches(PyExc_AttributeError)) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    return event;
}

static PyObject *Work_get_result(Work *w, void *unused)
{
    (void)unused;
    Py_INCREF(w->result);
    return w->result;
}

static PyObject *Work_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    PyObject *comm, *pending, *result;
    static char *names[] = {"comm", "pending", "result", NULL};
    (void)type;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOO", names, &comm, &pending, &result))
        return NULL;
    return (PyObject *)work_alloc(comm, pending, result);
}

static int Work_traverse(Work *w, visitproc visit, void *arg)
{
    Py_VISIT(w->comm);
    Py_VISIT(w->pending);
    Py_VISIT(w->result);
    Py_VISIT((PyObject *)w->books);
    Py_VISIT(w->arrays);
    Py_VISIT(w->copy.owner);
    return 0;
}

static int Work_clear(Work *w)
{
    Py_CLEAR(w->comm);
    Py_CLEAR(w->pending);
    Py_CLEAR(w->result);
    Py_CLEAR(w->books);
    Py_CLEAR(w->request_obj);
    Py_CLEAR(w->entry);
    Py_CLEAR(w->arrays);
    Py_CLEAR(w->copy.owner); /* and with it the copy */
    return 0;
}

static void Work_dealloc(Work *w)
{
    PyObject_GC_UnTrack(w);
    Work_clear(w);
    PyObject_GC_Del(w);
}

static PyMethodDef work_methods[] = {
    {"wait", (PyCFunction)Work_wait, METH_NOARGS,
     "wait() -> result: order the caller after the result (NCCL: the current stream; MPI: "
     "block until done, under the timeout)"},
    {"synchronize", (PyCFunction)Work_synchronize, METH_NOARGS,
     "synchronize() -> result: block the host until the operation has finished (the "
     "timeout applies)"},
    {"is_completed", (PyCFunction)Work_is_completed, METH_NOARGS,
     "is_completed() -> bool: True once the operation has finished (never blocks)"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef work_getset[] = {
    {"event", (getter)Work_get_event, NULL,
     "the CUDA event the operation completes with on the NCCL backend, or None (MPI, or a "
     "call still held by an open comm.group())",
     NULL},
    {"result", (getter)Work_get_result, NULL, "the output array (valid once waited)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject WorkType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "collectives.Work",
    .tp_basicsize = sizeof(Work),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The result of a call made with async_op=True.\n\n"
              "Example:\n"
              "    >>> work = comm.all_reduce(grad, async_op=True)\n"
              "    >>> ...                       # overlap other work\n"
              "    >>> work.wait()               # grad now holds the sum\n",
    .tp_new = Work_new,
    .tp_dealloc = (destructor)Work_dealloc,
    .tp_traverse = (traverseproc)Work_traverse,
    .tp_clear = (inquiry)Work_clear,
    .tp_methods = work_methods,
    .tp_getset = work_getset,
};

/* Tests each Work in the books' in_flight once, when it has grown to reap_at, so that
 * those nobody waits for are let go once complete. 0, or -1 with an error set. */
static int reap(CallBooks *b)
{
    if (PySet_GET_SIZE(b->in_flight) < b->reap_at)
        return 0;
    PyObject *works = PySequence_List(b->in_flight);
    if (works == NULL)
        return -1;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(works); i++) {
        Work *w = (Work *)PyList_GET_ITEM(works, i);
        if (w->books != NULL && poll_direct(w, -1.0) < 0) {
            Py_DECREF(works);
            return -1;
        }
    }
    Py_DECREF(works);
    Py_ssize_t twice = 2 * PySet_GET_SIZE(b->in_flight);
    b->reap_at = twice > REAP_AT ? twice : REAP_AT;
    return 0;
}

/* The Work of a direct-path call just posted (new reference), kept in the books' in_flight
 * until it completes. */
PyObject *direct_work(CallBooks *b, PyObject *request_obj, unsigned long long request,
                      PyObject *entry, PyObject *arrays, const Call *c)
{
    if (b->in_flight == NULL || b->front == Py_None) {
        PyErr_SetString(PyExc_RuntimeError, "these books have no front end to finish a Work");
        return NULL;
    }
    Work *w = work_alloc(Py_None, Py_None, c->result);
    if (w == NULL)
        return NULL;
    if (c->copy.bytes > 0) {
        w->copy = c->copy;
        Py_INCREF(w->copy.owner);
    }
    Py_INCREF(b);
    Py_INCREF(request_obj);
    Py_INCREF(entry);
    Py_INCREF(arrays);
    w->books = b;
    w->request_obj = request_obj;
    w->request = request;
    w->entry = entry;
    w->arrays = arrays;
    /* held before anything else may fail: MPI writes its arrays from now on */
    if (PySet_Add(b->in_flight, (PyObject *)w) < 0 || reap(b) < 0) {
        Py_DECREF(w);
        return NULL;
    }
    return (PyObject *)w;
}

/* CallBooks.hand_over(): every direct-path call in flight handed to the backend as a
 * Pending (before a close drains or abandons the backend's calls). */
PyObject *CallBooks_hand_over(CallBooks *b, PyObject *unused)
{
    (void)unused;
    if (b->in_flight == NULL)
        Py_RETURN_NONE;
    PyObject *works = PySequence_List(b->in_flight);
    if (works == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(works); i++) {
        Work *w = (Work *)PyList_GET_ITEM(works, i);
        if (w->books != NULL && hand_over(w) < 0) {
            Py_DECREF(works);
            return NULL;
        }
    }
    Py_DECREF(works);
    Py_RETURN_NONE;
}

/* Readies the type and its names (from the module's init): 0, or -1 with an error set. */
int work_ready(void)
{
    struct {
        PyObject **name;
        const char *text;
    } names[] = {{&s_wait, "_wait"}, {&s_synchronize, "_synchronize"}, {&s_test, "test"},
                 {&s_done, "done"},  {&s_event, "event"}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        *names[i].name = PyUnicode_InternFromString(names[i].text);
        if (*names[i].name == NULL)
            return -1;
    }
    return PyType_Ready(&WorkType);
}
