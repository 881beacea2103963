/* The books' numbering and one direct-path call: steps 1 to 5 of _books.py, in C (part of
 * collectives._callbooks; _callbooks.c says what the module is). */
#include "_callbooks.h"

/* ------------------------------------------------------------------ numbering, entries */

/* The form of a call that check mode compares: where MPI matches no two forms of a call
 * (blocking or kept synchronous calls), "synchronous" or "async_op=True" (inside a group
 * too); else None, as ranks may mix them. Borrowed. */
static PyObject *form_of(const CallBooks *b, int async_op)
{
    if (!b->blocking && b->kept_bytes <= 0)
        return Py_None;
    return async_op || b->grouped ? s_async_op : s_synchronous;
}

/* CallBooks.number: the call's seq, or -1 with an error set. */
static long long number(CallBooks *b, PyObject *call, int p2p, PyObject *array, PyObject *name,
                        PyObject *op, PyObject *root, int async_op)
{
    long long seq = ++b->seq;
    if (p2p) {
        b->p2p++;
        return seq;
    }
    long long nth = seq - b->p2p;
    if (b->slot_word != NULL)
        *b->slot_word = nth;
    if (b->checker != Py_None) {
        double t = now(), last = b->last_call;
        b->last_call = t;
        if (nth >= b->next_check || t - last > b->quiet) {
            PyObject *n = PyLong_FromLongLong(nth);
            PyObject *r = n == NULL ? NULL
                                    : PyObject_CallMethodObjArgs(b->checker, s_verify, n, call,
                                                                 array, name, op, root,
                                                                 form_of(b, async_op), NULL);
            Py_XDECREF(n);
            if (r == NULL)
                return -1;
            Py_DECREF(r);
        }
    }
    return seq;
}

/* `array`'s shape: from its buffer where the verb holds it (`view`), as numpy gives it
 * (new reference), or None. */
static PyObject *shape_of(PyObject *array, const Py_buffer *view)
{
    if (array == Py_None)
        Py_RETURN_NONE;
    if (view == NULL)
        return PyObject_GetAttr(array, s_shape);
    PyObject *shape = PyTuple_New(view->ndim);
    for (int i = 0; shape != NULL && i < view->ndim; i++) {
        PyObject *n = PyLong_FromSsize_t(view->shape[i]);
        if (n == NULL)
            Py_CLEAR(shape);
        else
            PyTuple_SET_ITEM(shape, i, n);
    }
    return shape;
}

/* CallBooks.begin: number() and an Entry appended to the recorder (new reference). */
static PyObject *begin(CallBooks *b, PyObject *call, int p2p, PyObject *array,
                       const Py_buffer *view, PyObject *name, PyObject *op, PyObject *root,
                       int async_op)
{
    long long seq = number(b, call, p2p, array, name, op, root, async_op);
    if (seq < 0)
        return NULL;
    PyObject *shape = shape_of(array, view);
    if (shape == NULL)
        return NULL;
    PyObject *entry = new_entry(seq, call, shape, name);
    Py_DECREF(shape);
    if (entry == NULL)
        return NULL;
    PyObject *r = PyObject_CallOneArg(b->record, entry);
    if (r == NULL) {
        Py_DECREF(entry);
        return NULL;
    }
    Py_DECREF(r);
    return entry;
}

static int is_p2p(PyObject *call)
{
    return point_to_point == NULL ? 0 : PySet_Contains(point_to_point, call);
}

PyObject *CallBooks_take(CallBooks *b, PyObject *call)
{
    if (b->busy) {
        PyObject *text = PyUnicode_FromFormat("%S: %S", call, in_use_text);
        if (text != NULL) {
            PyErr_SetObject(in_use_error, text);
            Py_DECREF(text);
        }
        return NULL;
    }
    b->busy = 1;
    Py_RETURN_NONE;
}

PyObject *CallBooks_give(CallBooks *b, PyObject *unused)
{
    (void)unused;
    b->busy = 0;
    Py_RETURN_NONE;
}

PyObject *CallBooks_number(CallBooks *b, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "number(call, array, name, op, root, async_op)");
        return NULL;
    }
    int p2p = is_p2p(args[0]), async_op = PyObject_IsTrue(args[5]);
    long long seq = p2p < 0 || async_op < 0 ? -1
                                            : number(b, args[0], p2p, args[1], args[2], args[3],
                                                     args[4], async_op);
    return seq < 0 ? NULL : PyLong_FromLongLong(seq);
}

/* ------------------------------------------------------------------------ one call, run */

/* Sets mpi4py's MPI.Exception of the MPI error code `rc`; NULL. */
static PyObject *mpi_error_of(int rc)
{
    PyObject *code = PyLong_FromLong(rc);
    if (code != NULL) {
        PyErr_SetObject(mpi_exception, code);
        Py_DECREF(code);
    }
    return NULL;
}

/* A handle as mpi4py gives it (None: a call that takes none, e.g. a broadcast's op). */
unsigned long long handle_of(PyObject *value, int *failed)
{
    *failed = 0;
    if (value == Py_None)
        return 0;
    unsigned long long v = PyLong_AsUnsignedLongLongMask(value);
    *failed = v == (unsigned long long)-1 && PyErr_Occurred();
    return v;
}

/* Lets go of what buffers_of() held. */
static void release_buffers(Py_buffer *sv, Py_buffer *rv)
{
    if (sv->obj != NULL)
        PyBuffer_Release(sv);
    if (rv->obj != NULL)
        PyBuffer_Release(rv);
}

/* The memory of the call's send and recv (NULL: None), held in sv and rv where the verb
 * does not hold it (release_buffers lets go): 0, or -1 with an error set. */
static int buffers_of(const Call *c, Py_buffer *sv, Py_buffer *rv)
{
    memset(sv, 0, sizeof *sv);
    memset(rv, 0, sizeof *rv);
    sv->buf = (void *)c->send_at;
    rv->buf = c->recv_at;
    if (c->send != Py_None && sv->buf == NULL &&
        PyObject_GetBuffer(c->send, sv, PyBUF_SIMPLE) < 0)
        return -1;
    /* a broadcast's buffer is only read on the root: its caller checked the others' */
    if (c->recv != Py_None && rv->buf == NULL &&
        PyObject_GetBuffer(c->recv, rv, c->kind == BROADCAST ? PyBUF_SIMPLE : PyBUF_WRITABLE) <
            0) {
        if (sv->obj != NULL)
            PyBuffer_Release(sv);
        return -1;
    }
    return 0;
}

/* A kept call (_callbooks_kept.c): its input staged and its request started; the request's
 * handle, and in *recv the memory its result is copied to once complete (NULL: none). */
static PyObject *start_kept(CallBooks *b, const Call *c, Kept *k, unsigned long long *request,
                            void **recv)
{
    Py_buffer sv, rv;
    if (buffers_of(c, &sv, &rv) < 0)
        return NULL;
    kept_in(b, k, sv.buf, rv.buf);
    *recv = rv.buf; /* the call's arrays outlive it: their memory stays */
    release_buffers(&sv, &rv);
    unsigned long long *kept = kept_request(k);
    int rc = primitives->start(kept);
    *request = *kept;
    if (rc != 0)
        return mpi_error_of(rc);
    return PyLong_FromUnsignedLongLong(*request);
}

/* The request as Python sees it: the handle (C primitives), or mpi4py's request. */
static PyObject *post(CallBooks *b, const Call *c, int blocking, PyObject *counts,
                      unsigned long long *request)
{
    if (primitives == NULL) {
        PyObject *args[11] = {NULL};
        PyObject *r = NULL;
        args[0] = PyLong_FromLong(c->kind);
        args[5] = PyLong_FromLongLong(c->count);
        args[8] = PyLong_FromLong(c->root_rank);
        args[9] = PyLong_FromLong(c->source_rank);
        if (args[0] && args[5] && args[8] && args[9]) {
            args[1] = blocking ? Py_True : Py_False;
            args[2] = b->handle;
            args[3] = c->send;
            args[4] = c->recv;
            args[6] = c->datatype;
            args[7] = c->mpi_op;
            args[10] = counts;
            r = PyObject_Vectorcall(py_post, args, 11, NULL);
        }
        Py_XDECREF(args[0]);
        Py_XDECREF(args[5]);
        Py_XDECREF(args[8]);
        Py_XDECREF(args[9]);
        return r;
    }
    int failed[3];
    unsigned long long comm = handle_of(b->handle, &failed[0]);
    unsigned long long datatype = handle_of(c->datatype, &failed[1]);
    unsigned long long op = handle_of(c->mpi_op, &failed[2]);
    if (failed[0] || failed[1] || failed[2])
        return NULL;
    Py_buffer sv, rv;
    if (buffers_of(c, &sv, &rv) < 0)
        return NULL;
    const void *words = counts == Py_None ? NULL : PyBytes_AS_STRING(counts);
    int rc;
    if (blocking) {
        Py_BEGIN_ALLOW_THREADS
        rc = primitives->post(c->kind, 1, comm, sv.buf, rv.buf, c->count, datatype, op,
                              c->root_rank, c->source_rank, words, request);
        Py_END_ALLOW_THREADS
    } else {
        rc = primitives->post(c->kind, 0, comm, sv.buf, rv.buf, c->count, datatype, op,
                              c->root_rank, c->source_rank, words, request);
    }
    release_buffers(&sv, &rv);
    if (rc != 0)
        return mpi_error_of(rc);
    if (blocking)
        Py_RETURN_NONE;
    return PyLong_FromUnsignedLongLong(*request);
}

/* Memory for `nbytes` of a result that is copied where it belongs once complete (new
 * reference): the books' own bytearray, grown as needed, unless a call in flight holds it
 * (its Work and arrays let go of it once complete), then a new one. Reusing one buffer
 * matters: MPI libraries make fresh memory slow (MPICH's and Intel MPI's 1 MiB calls take
 * several times as long). NULL with an error set. */
PyObject *scratch(CallBooks *b, Py_ssize_t nbytes)
{
    if (b->scratch != NULL && Py_REFCNT(b->scratch) > 1) /* lent to a call in flight */
        return PyByteArray_FromStringAndSize(NULL, nbytes);
    if (b->scratch == NULL || PyByteArray_GET_SIZE(b->scratch) < nbytes) {
        PyObject *fresh = PyByteArray_FromStringAndSize(NULL, nbytes);
        if (fresh == NULL)
            return NULL;
        Py_XSETREF(b->scratch, fresh);
    }
    Py_INCREF(b->scratch);
    return b->scratch;
}

/* The copy (or reduction) a call asked for once complete: 0, or -1 with an error set. */
int make_copy(const Copy *k)
{
    if (k->op == NULL) {
        memcpy(k->to, k->from, (size_t)k->bytes);
        return 0;
    }
    if (primitives == NULL) {
        PyObject *from = PyMemoryView_FromMemory((char *)k->from, k->bytes, PyBUF_READ);
        PyObject *to = PyMemoryView_FromMemory(k->to, k->bytes, PyBUF_WRITE);
        PyObject *count = PyLong_FromLongLong(k->count);
        PyObject *r = from && to && count ? PyObject_CallFunctionObjArgs(
                                                py_reduce_local, from, to, count, k->datatype,
                                                k->op, NULL)
                                          : NULL;
        Py_XDECREF(from);
        Py_XDECREF(to);
        Py_XDECREF(count);
        Py_XDECREF(r);
        return r == NULL ? -1 : 0;
    }
    int failed[2];
    unsigned long long datatype = handle_of(k->datatype, &failed[0]);
    unsigned long long op = handle_of(k->op, &failed[1]);
    if (failed[0] || failed[1])
        return -1;
    int rc = primitives->reduce_local(k->from, k->to, k->count, datatype, op);
    if (rc != 0) {
        mpi_error_of(rc);
        return -1;
    }
    return 0;
}

/* Polls the request for yield_after seconds (below 0: tests it once): 1 done, 0 not yet, -1
 * an error set. */
int poll_call(double yield_after, PyObject **request_obj, unsigned long long *request)
{
    if (primitives == NULL) {
        PyObject *y = PyFloat_FromDouble(yield_after);
        PyObject *r =
            y == NULL ? NULL : PyObject_CallFunctionObjArgs(py_poll, *request_obj, y, NULL);
        Py_XDECREF(y);
        if (r == NULL)
            return -1;
        int done = PyObject_IsTrue(r);
        Py_DECREF(r);
        return done;
    }
    int rc, done = 0;
    Py_BEGIN_ALLOW_THREADS
    rc = primitives->poll(request, yield_after, &done);
    Py_END_ALLOW_THREADS
    if (rc != 0) {
        mpi_error_of(rc);
        return -1;
    }
    if (!done) { /* the request as MPI_Test left it, for the wait that goes on */
        PyObject *fresh = PyLong_FromUnsignedLongLong(*request);
        if (fresh == NULL)
            return -1;
        Py_SETREF(*request_obj, fresh);
    }
    return done;
}

/* Steps 2 to 5 of _books.py once the token is taken: the result (new reference), or NULL. */
static PyObject *post_and_wait(CallBooks *b, const Call *c, PyObject *call)
{
    int later = c->async_op || b->grouped;
    /* point-to-point calls are not numbered as collectives; a send or a recv is never
     * blocking (a rank may send before it receives), a sendrecv may be */
    int p2p = c->kind == SEND || c->kind == RECV || c->kind == SENDRECV;
    int blocking = b->blocking && c->kind != SEND && c->kind != RECV && !later;
    /* each rank's count, as wide as the primitives take them, kept with the arrays until
     * the call completes */
    PyObject *counts = Py_None;
    if (c->counted && (counted_reduce_scatter & (blocking ? 2 : 1))) {
        int wide = primitives == NULL || primitives->count_bytes == 8;
        counts = PyBytes_FromStringAndSize(NULL, b->size * (wide ? 8 : 4));
        if (counts == NULL)
            return NULL;
        for (int i = 0; i < b->size; i++) {
            if (wide)
                ((long long *)PyBytes_AS_STRING(counts))[i] = c->count;
            else
                ((int *)PyBytes_AS_STRING(counts))[i] = (int)c->count;
        }
    } else {
        Py_INCREF(counts);
    }
    PyObject *entry =
        begin(b, call, p2p, c->array, c->array_view, c->name, c->op, c->root, c->async_op);
    if (entry == NULL) {
        Py_DECREF(counts);
        return NULL;
    }
    /* a small synchronous call: a kept persistent request, polled (never blocking) */
    int failed;
    void *kept_recv = NULL;
    Kept *kept = kept_for(b, c, &failed);
    if (kept != NULL)
        blocking = 0;
    /* A blocking call cannot post anything once begun: the board says beforehand that this
     * rank is inside it (nth * 16 + code, as _progress.BLOCKING_CALLS), and 0 once it returns */
    long long *inside = blocking ? b->inside_word : NULL;
    if (inside != NULL)
        *inside = (((Entry *)entry)->seq - b->p2p) * 16 + c->kind + 1;
    unsigned long long request = 0;
    PyObject *request_obj = failed          ? NULL
                            : kept != NULL ? start_kept(b, c, kept, &request, &kept_recv)
                                           : post(b, c, blocking, counts, &request);
    if (inside != NULL)
        *inside = 0;
    PyObject *result = NULL;
    if (request_obj == NULL) { /* posting failed: nothing is in flight to record */
        PyObject *type, *value, *traceback;
        PyErr_Fetch(&type, &value, &traceback);
        PyObject *r = PyObject_CallMethodNoArgs(b->recorder, s_pop);
        Py_XDECREF(r);
        PyErr_Clear();
        PyErr_Restore(type, value, traceback);
        goto done;
    }
    /* what MPI may still read or write, for a call that outlives this function (made only
     * then: most synchronous calls complete here) */
    PyObject *arrays = NULL;
    if (later) {
        if ((arrays = PyTuple_Pack(3, c->send, c->recv, counts)) == NULL)
            goto done;
        result = direct_work(b, request_obj, request, entry, arrays, c);
        if (result != NULL && b->grouped) { /* held until the group ends, which waits for it */
            if (!PyList_Check(b->held) || PyList_Append(b->held, result) < 0) {
                if (!PyErr_Occurred())
                    PyErr_SetString(PyExc_RuntimeError, "a group without its list of Works");
                Py_CLEAR(result);
            } else if (!c->async_op) {
                Py_INCREF(c->result);
                Py_SETREF(result, c->result);
            }
        }
    } else {
        /* polling failed: the call was posted, so its entry stays, never completed */
        int done = request_obj == Py_None ? 1 : poll_call(b->yield_after, &request_obj, &request);
        if (done == 0 && (arrays = PyTuple_Pack(3, c->send, c->recv, counts)) == NULL)
            done = -1;
        if (done == 0) {
            PyObject *r = PyObject_CallFunctionObjArgs(b->wait_long, request_obj, entry, arrays,
                                                       NULL);
            done = r == NULL ? -1 : 1;
            Py_XDECREF(r);
        }
        if (done > 0) {
            if (kept != NULL)
                kept_out(b, kept, kept_recv);
            if (c->copy.bytes == 0 || make_copy(&c->copy) == 0) {
                ((Entry *)entry)->end = now();
                Py_INCREF(c->result);
                result = c->result;
            }
        }
    }
    Py_XDECREF(arrays);
done:
    Py_XDECREF(request_obj);
    Py_DECREF(entry);
    Py_DECREF(counts);
    return result;
}

/* Hands the MPI error being raised to books.mpi_error, which raises it as the front end's
 * error, the communicator dead (the call's name says which call failed): NULL. Other errors
 * pass as they are. */
PyObject *raise_mpi_error(CallBooks *b, PyObject *call)
{
    if (!PyErr_ExceptionMatches(mpi_exception))
        return NULL;
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    PyErr_NormalizeException(&type, &value, &traceback);
    if (traceback != NULL)
        PyException_SetTraceback(value, traceback);
    PyObject *r = PyObject_CallFunctionObjArgs(b->mpi_error, call, value, NULL);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(traceback);
    return r; /* it raises: NULL */
}

/* The thread guards around post_and_wait; an MPI error is handed to books.mpi_error once
 * the token is back (the communicator dies of it). NotImplemented: not the owner thread, or
 * the token is taken: the general path refuses the call, or says so. */
PyObject *run(CallBooks *b, const Call *c)
{
    if (b->owner != PyThread_get_thread_ident() || b->busy)
        Py_RETURN_NOTIMPLEMENTED;
    PyObject *call = PyTuple_GET_ITEM(kind_names, c->kind);
    b->busy = 1;
    PyObject *result = post_and_wait(b, c, call);
    b->busy = 0;
    return result != NULL ? result : raise_mpi_error(b, call);
}
