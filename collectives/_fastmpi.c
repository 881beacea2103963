/* The direct path's MPI primitives in C: post one MPI call, poll one request.
 *
 * A call into mpi4py costs about what a small message costs on the wire, so the direct path
 * (collectives/_direct.py) posts its MPI calls and polls their requests here. Everything else,
 * the argument checks and the books (collectives/_books.py: the thread token, numbering,
 * check mode, the progress board, the flight recorder, the deadline), is Python's, written
 * once; this module keeps no state per call and reads no Python object but the buffers and
 * the ints it is handed. _direct.py has the same two primitives on mpi4py, used where this
 * did not build (or with COLLECTIVES_PURE_PYTHON=1).
 *
 *   post(kind, blocking, comm, send, recv, count, datatype, op, root)
 *       posts the MPI call `kind` (KINDS in _direct.py) on buffers `send` and `recv` (objects
 *       with the buffer protocol, or None: MPI_IN_PLACE where the call has an in-place form,
 *       else NULL), `count` elements (per rank for the calls that split by rank), the MPI
 *       handles `comm`, `datatype` and `op` as ints, `root` (the peer of send and recv).
 *       Returns the request's handle, or None once a blocking call (`blocking`: all_reduce and
 *       broadcast only) has returned, the GIL released around it. An MPI error raises
 *       mpi4py's MPI.Exception: nothing was posted.
 *   poll(request, yield_after)
 *       MPI_Test on the request, the GIL released, until it completes (True) or HAND_BACK
 *       seconds past `yield_after` have passed (False: the caller waits on, under the
 *       timeout): busy for `yield_after`, then yielding the core after each test, as a rank
 *       whose peer needs this core must (more ranks than cores). An MPI error raises
 *       MPI.Exception: the call was posted.
 *
 * The MPI functions are the ones mpi4py's libmpi exports, passed in as addresses by setup():
 * this module links against no MPI. It is built twice, once per ABI, and _direct.py picks the
 * build that matches mpi4py's library before setup():
 *   collectives._fastmpi       the MPICH ABI (int handles, the MPI-4 large-count calls with a
 *                              64-bit MPI_Count): MPICH, Intel MPI, Cray MPICH, MVAPICH;
 *   collectives._fastmpi_ompi  Open MPI's (pointer handles, int counts: Open MPI 5.0 has no
 *                              large-count calls, so a larger count goes the general path).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <limits.h>
#include <sched.h>
#include <stdint.h>
#include <time.h>

#ifdef FASTMPI_POINTER_HANDLES
typedef intptr_t Handle; /* MPI_Comm, MPI_Datatype, MPI_Op, MPI_Request: pointers */
typedef int Count;       /* the count of the calls without _c */
#define COUNT_MAX INT_MAX
#define MODULE_NAME "collectives._fastmpi_ompi"
#define MODULE_INIT PyInit__fastmpi_ompi
#else
typedef int Handle;      /* MPI_Comm, MPI_Datatype, MPI_Op, MPI_Request */
typedef long long Count; /* MPI_Count */
#define COUNT_MAX LLONG_MAX
#define MODULE_NAME "collectives._fastmpi"
#define MODULE_INIT PyInit__fastmpi
#endif
typedef const void *In;
typedef void *Out;
typedef Handle *Req;
typedef int (*IallreduceFn)(In, Out, Count, Handle, Handle, Handle, Req);
typedef int (*IbcastFn)(Out, Count, Handle, int, Handle, Req);
typedef int (*IreduceFn)(In, Out, Count, Handle, Handle, int, Handle, Req);
typedef int (*IallgatherFn)(In, Count, Handle, Out, Count, Handle, Handle, Req);
typedef int (*IreduceScatterFn)(In, Out, Count, Handle, Handle, Handle, Req);
typedef int (*IrootedFn)(In, Count, Handle, Out, Count, Handle, int, Handle, Req);
typedef int (*IsendFn)(In, Count, Handle, int, int, Handle, Req);
typedef int (*IrecvFn)(Out, Count, Handle, int, int, Handle, Req);
typedef int (*IbarrierFn)(Handle, Req);
typedef int (*AllreduceFn)(In, Out, Count, Handle, Handle, Handle);
typedef int (*BcastFn)(Out, Count, Handle, int, Handle);
typedef int (*TestFn)(Req, int *, void *);

/* The kinds, in the order of _direct.KINDS (and of setup()'s addresses). */
enum { ALL_REDUCE, BROADCAST, REDUCE, ALL_GATHER, REDUCE_SCATTER, ALL_TO_ALL, GATHER, SCATTER,
       SEND, RECV, BARRIER, KINDS };

static void *calls[KINDS];        /* the non-blocking MPI call of each kind */
static AllreduceFn mpi_allreduce; /* the blocking ones, for communicators that ask for them */
static BcastFn mpi_bcast;
static TestFn mpi_test;
static void *mpi_in_place;
static int tag;             /* the tag of send and recv */
static PyObject *mpi_error; /* mpi4py's MPI.Exception: called with the error code */

/* seconds of yielding polls before poll() hands a call back to the caller's wait */
#define HAND_BACK 0.01

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static PyObject *raise_mpi_error(int rc)
{
    PyObject *error = PyObject_CallFunction(mpi_error, "i", rc);
    if (error != NULL) {
        PyErr_SetObject((PyObject *)Py_TYPE(error), error);
        Py_DECREF(error);
    }
    return NULL;
}

/* mpi4py gives int handles sign-extended to 64 bits (their low 32 bits are the handle), and
 * pointer handles as their address. */
static int as_handle(PyObject *value, Handle *handle)
{
    unsigned long long v = PyLong_AsUnsignedLongLongMask(value);
    if (v == (unsigned long long)-1 && PyErr_Occurred())
        return -1;
#ifdef FASTMPI_POINTER_HANDLES
    *handle = (Handle)(uintptr_t)v;
#else
    *handle = (Handle)(unsigned)v;
#endif
    return 0;
}

/* The buffer of `array` (None: `none`), held in *view until released. 0, or -1 with an
 * error set. */
static int take(PyObject *array, Py_buffer *view, int writable, void *none, void **buf)
{
    view->obj = NULL;
    if (array == Py_None) {
        *buf = none;
        return 0;
    }
    if (PyObject_GetBuffer(array, view, writable ? PyBUF_WRITABLE : PyBUF_SIMPLE) < 0)
        return -1;
    *buf = view->buf;
    return 0;
}

/* post(kind, blocking, comm, send, recv, count, datatype, op, root) */
static PyObject *post(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 9) {
        PyErr_SetString(PyExc_TypeError, "post takes 9 arguments");
        return NULL;
    }
    int kind = PyLong_AsLong(args[0]), blocking = PyObject_IsTrue(args[1]);
    long long count = PyLong_AsLongLong(args[5]);
    int root = PyLong_AsLong(args[8]);
    Handle comm, datatype, op, request = 0;
    if (PyErr_Occurred() || blocking < 0 || as_handle(args[2], &comm) < 0 ||
        as_handle(args[6], &datatype) < 0 || as_handle(args[7], &op) < 0)
        return NULL;
    if (kind < 0 || kind >= KINDS || count < 0 || count > (long long)COUNT_MAX) {
        PyErr_SetString(PyExc_ValueError, "post: no such kind, or a count out of range");
        return NULL;
    }
    Py_buffer sv, rv;
    void *s, *r;
    if (take(args[3], &sv, 0, kind == SCATTER ? NULL : mpi_in_place, &s) < 0)
        return NULL;
    /* a broadcast's buffer is only read on the root: its caller checked the others' */
    if (take(args[4], &rv, kind != BROADCAST, kind == SCATTER ? mpi_in_place : NULL, &r) < 0) {
        if (sv.obj != NULL)
            PyBuffer_Release(&sv);
        return NULL;
    }
    Count n = (Count)count;
    int rc;
    blocking = blocking && (kind == ALL_REDUCE || kind == BROADCAST);
    if (blocking) {
        Py_BEGIN_ALLOW_THREADS
        if (kind == ALL_REDUCE)
            rc = mpi_allreduce(s, r, n, datatype, op, comm);
        else
            rc = mpi_bcast(r, n, datatype, root, comm);
        Py_END_ALLOW_THREADS
    } else {
        void *f = calls[kind];
        switch (kind) {
        case ALL_REDUCE:
            rc = ((IallreduceFn)f)(s, r, n, datatype, op, comm, &request);
            break;
        case BROADCAST:
            rc = ((IbcastFn)f)(r, n, datatype, root, comm, &request);
            break;
        case REDUCE:
            rc = ((IreduceFn)f)(s, r, n, datatype, op, root, comm, &request);
            break;
        case ALL_GATHER:
        case ALL_TO_ALL:
            rc = ((IallgatherFn)f)(s, n, datatype, r, n, datatype, comm, &request);
            break;
        case REDUCE_SCATTER:
            rc = ((IreduceScatterFn)f)(s, r, n, datatype, op, comm, &request);
            break;
        case GATHER:
        case SCATTER:
            rc = ((IrootedFn)f)(s, n, datatype, r, n, datatype, root, comm, &request);
            break;
        case SEND:
            rc = ((IsendFn)f)(s, n, datatype, root, tag, comm, &request);
            break;
        case RECV:
            rc = ((IrecvFn)f)(r, n, datatype, root, tag, comm, &request);
            break;
        default:
            rc = ((IbarrierFn)f)(comm, &request);
        }
    }
    if (sv.obj != NULL)
        PyBuffer_Release(&sv);
    if (rv.obj != NULL)
        PyBuffer_Release(&rv);
    if (rc != 0)
        return raise_mpi_error(rc);
    if (blocking)
        Py_RETURN_NONE;
    /* mpi4py takes handles sign-extended to 64 bits, as it gives them */
    return PyLong_FromUnsignedLongLong((unsigned long long)(long long)request);
}

/* poll(request, yield_after): True once complete, False after yield_after seconds */
static PyObject *poll(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "poll takes 2 arguments");
        return NULL;
    }
    Handle request;
    double yield_after = PyFloat_AsDouble(args[1]);
    if ((yield_after == -1.0 && PyErr_Occurred()) || as_handle(args[0], &request) < 0)
        return NULL;
    int status[16]; /* MPI_Status is 20 bytes under the MPICH ABI, 24 under Open MPI's */
    int rc, done = 0;
    unsigned polls = 0;
    Py_BEGIN_ALLOW_THREADS
    double start = now(), waited = 0.0;
    while ((rc = mpi_test(&request, &done, status)) == 0 && !done) {
        if (waited > yield_after) { /* yield after each test, for a while */
            sched_yield();
            if ((waited = now() - start) > yield_after + HAND_BACK)
                break;
        } else if ((++polls & 255) == 0) {
            waited = now() - start;
        }
    }
    Py_END_ALLOW_THREADS
    if (rc != 0)
        return raise_mpi_error(rc);
    return PyBool_FromLong(done);
}

/* setup(addresses, in_place, tag, error): addresses are the non-blocking calls of each kind,
 * then the blocking all-reduce and broadcast, then MPI_Test. */
static PyObject *setup(PyObject *self, PyObject *args)
{
    PyObject *addresses, *error;
    long long in_place;
    int the_tag;
    (void)self;
    if (!PyArg_ParseTuple(args, "O!LiO", &PyList_Type, &addresses, &in_place, &the_tag, &error))
        return NULL;
    if (PyList_GET_SIZE(addresses) != KINDS + 3) {
        PyErr_Format(PyExc_ValueError, "setup: %d addresses expected", KINDS + 3);
        return NULL;
    }
    void *found[KINDS + 3];
    for (int i = 0; i < KINDS + 3; i++) {
        found[i] = PyLong_AsVoidPtr(PyList_GET_ITEM(addresses, i));
        if (found[i] == NULL) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "setup: a null address");
            return NULL;
        }
    }
    for (int i = 0; i < KINDS; i++)
        calls[i] = found[i];
    mpi_allreduce = (AllreduceFn)found[KINDS];
    mpi_bcast = (BcastFn)found[KINDS + 1];
    mpi_test = (TestFn)found[KINDS + 2];
    mpi_in_place = (void *)(intptr_t)in_place;
    tag = the_tag;
    Py_INCREF(error);
    Py_XSETREF(mpi_error, error);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"post", (PyCFunction)(void (*)(void))post, METH_FASTCALL,
     "post(kind, blocking, comm, send, recv, count, datatype, op, root) -> request or None"},
    {"poll", (PyCFunction)(void (*)(void))poll, METH_FASTCALL,
     "poll(request, yield_after) -> whether it completed"},
    {"setup", setup, METH_VARARGS, "setup(addresses, in_place, tag, error)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, MODULE_NAME, NULL, -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC MODULE_INIT(void)
{
    return PyModule_Create(&module);
}
