/* The direct path's inner loop in C: start a non-blocking MPI collective on host buffers and
 * poll it until it completes, or hand it back to Python once it has lasted `yield_after`.
 *
 * Python costs per call what small messages take on the wire, so the start and the polling
 * loop live here (collectives/_direct.py is the same in Python, and the fallback). The MPI
 * functions are the ones mpi4py's libmpi exports, passed in as addresses by setup(): this
 * module links against no MPI, and it speaks the MPICH ABI (integer handles, 64-bit
 * MPI_Count): MPICH, Intel MPI, Cray MPICH, MVAPICH. _direct.py checks that before setup().
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <time.h>

typedef int Handle; /* MPI_Comm, MPI_Datatype, MPI_Op, MPI_Request */
typedef long long Count; /* MPI_Count */
typedef int (*IallreduceFn)(const void *, void *, Count, Handle, Handle, Handle, Handle *);
typedef int (*IbcastFn)(void *, Count, Handle, int, Handle, Handle *);
typedef int (*TestFn)(Handle *, int *, void *);

static IallreduceFn mpi_iallreduce;
static IbcastFn mpi_ibcast;
static TestFn mpi_test;
static void *mpi_in_place;
static PyObject *mpi_error;           /* mpi4py's MPI.Exception: called with the error code */
static PyObject *request_from_handle; /* MPI.Request.fromhandle */

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Poll `request` (the GIL released) until it completes or has lasted `yield_after`. */
static int poll(Handle *request, int *done, double yield_after)
{
    int status[16]; /* MPI_Status is 20 bytes under the MPICH ABI */
    double start = now();
    unsigned polls = 0;
    int rc;
    while ((rc = mpi_test(request, done, status)) == 0 && !*done) {
        if ((++polls & 255) == 0 && now() - start > yield_after)
            break;
    }
    return rc;
}

/* None once complete; the MPI.Request still in flight; or the MPI error raised. */
static PyObject *finish(int rc, int done, Handle request)
{
    if (rc != 0) {
        PyObject *error = PyObject_CallFunction(mpi_error, "i", rc);
        if (error != NULL) {
            PyErr_SetObject((PyObject *)Py_TYPE(error), error);
            Py_DECREF(error);
        }
        return NULL;
    }
    if (done)
        Py_RETURN_NONE;
    /* mpi4py takes handles sign-extended to 64 bits, as it gives them */
    return PyObject_CallFunction(request_from_handle, "K", (unsigned long long)(long long)request);
}

/* mpi4py gives handles sign-extended to 64 bits: their low 32 bits are the handle. */
static int as_handle(PyObject *value, Handle *handle)
{
    unsigned long long v = PyLong_AsUnsignedLongLongMask(value);
    if (v == (unsigned long long)-1 && PyErr_Occurred())
        return -1;
    *handle = (Handle)(unsigned)v;
    return 0;
}

static int as_double(PyObject *value, double *d)
{
    *d = PyFloat_AsDouble(value);
    return (*d == -1.0 && PyErr_Occurred()) ? -1 : 0;
}

/* all_reduce(comm, send, recv, datatype, op, yield_after): send None is in place. */
static PyObject *all_reduce(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    Handle comm, datatype, op, request = 0;
    double yield_after;
    Py_buffer send, recv;
    int rc, done = 0;
    (void)self;
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "all_reduce takes 6 arguments");
        return NULL;
    }
    if (as_handle(args[0], &comm) || as_handle(args[3], &datatype) ||
        as_handle(args[4], &op) || as_double(args[5], &yield_after))
        return NULL;
    if (PyObject_GetBuffer(args[2], &recv, PyBUF_WRITABLE) < 0)
        return NULL;
    if (args[1] != Py_None && PyObject_GetBuffer(args[1], &send, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&recv);
        return NULL;
    }
    Count count = recv.len / (recv.itemsize ? recv.itemsize : 1);
    const void *source = args[1] == Py_None ? mpi_in_place : send.buf;
    Py_BEGIN_ALLOW_THREADS
    rc = mpi_iallreduce(source, recv.buf, count, datatype, op, comm, &request);
    if (rc == 0)
        rc = poll(&request, &done, yield_after);
    Py_END_ALLOW_THREADS
    if (args[1] != Py_None)
        PyBuffer_Release(&send);
    PyBuffer_Release(&recv);
    return finish(rc, done, request);
}

/* broadcast(comm, buffer, datatype, root, yield_after): the root's buffer is only read. */
static PyObject *broadcast(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    Handle comm, datatype, root, request = 0;
    double yield_after;
    Py_buffer buffer;
    int rc, done = 0;
    (void)self;
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "broadcast takes 5 arguments");
        return NULL;
    }
    if (as_handle(args[0], &comm) || as_handle(args[2], &datatype) ||
        as_handle(args[3], &root) || as_double(args[4], &yield_after))
        return NULL;
    if (PyObject_GetBuffer(args[1], &buffer, PyBUF_SIMPLE) < 0)
        return NULL;
    Count count = buffer.len / (buffer.itemsize ? buffer.itemsize : 1);
    Py_BEGIN_ALLOW_THREADS
    rc = mpi_ibcast(buffer.buf, count, datatype, root, comm, &request);
    if (rc == 0)
        rc = poll(&request, &done, yield_after);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&buffer);
    return finish(rc, done, request);
}

/* setup(iallreduce_c, ibcast_c, test, in_place, error_type, request_from_handle) */
static PyObject *setup(PyObject *self, PyObject *args)
{
    unsigned long long iallreduce, ibcast, test;
    long long in_place;
    PyObject *error, *from_handle;
    (void)self;
    if (!PyArg_ParseTuple(args, "KKKLOO", &iallreduce, &ibcast, &test, &in_place, &error,
                          &from_handle))
        return NULL;
    mpi_iallreduce = (IallreduceFn)(uintptr_t)iallreduce;
    mpi_ibcast = (IbcastFn)(uintptr_t)ibcast;
    mpi_test = (TestFn)(uintptr_t)test;
    mpi_in_place = (void *)(intptr_t)in_place;
    Py_INCREF(error);
    Py_XSETREF(mpi_error, error);
    Py_INCREF(from_handle);
    Py_XSETREF(request_from_handle, from_handle);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"all_reduce", (PyCFunction)(void (*)(void))all_reduce, METH_FASTCALL,
     "all_reduce(comm, send, recv, datatype, op, yield_after) -> MPI.Request | None"},
    {"broadcast", (PyCFunction)(void (*)(void))broadcast, METH_FASTCALL,
     "broadcast(comm, buffer, datatype, root, yield_after) -> MPI.Request | None"},
    {"setup", setup, METH_VARARGS, "setup(iallreduce_c, ibcast_c, test, in_place, error, "
                                   "request_from_handle): the MPI functions to call"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "collectives._fastmpi", NULL, -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__fastmpi(void)
{
    return PyModule_Create(&module);
}
