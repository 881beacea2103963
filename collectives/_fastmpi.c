/* The direct path's MPI primitives in C: post one MPI call, poll one request.
 *
 * A call into mpi4py costs about what a small message costs on the wire, so the books
 * (collectives/_callbooks.c, which keep every call's record) post the direct path's MPI calls
 * and poll their requests here, without Python in between: this module gives them two C
 * functions in the capsule `primitives` (_primitives.h says what each does). It keeps no
 * state per call and touches no Python object. _direct.py has the same two primitives on
 * mpi4py, used where this did not build (or with COLLECTIVES_PURE_PYTHON=1).
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
#include <sched.h>
#include <stdint.h>
#include <time.h>

#include "_primitives.h"

#ifdef FASTMPI_POINTER_HANDLES
typedef intptr_t Handle; /* MPI_Comm, MPI_Datatype, MPI_Op, MPI_Request: pointers */
typedef int Count;       /* the count of the calls without _c */
#define MODULE_NAME "collectives._fastmpi_ompi"
#define MODULE_INIT PyInit__fastmpi_ompi
#else
typedef int Handle;      /* MPI_Comm, MPI_Datatype, MPI_Op, MPI_Request */
typedef long long Count; /* MPI_Count */
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
typedef int (*IreduceScatterVFn)(In, Out, const Count *, Handle, Handle, Handle, Req);
typedef int (*ReduceScatterVFn)(In, Out, const Count *, Handle, Handle, Handle);
typedef int (*IrootedFn)(In, Count, Handle, Out, Count, Handle, int, Handle, Req);
typedef int (*IsendFn)(In, Count, Handle, int, int, Handle, Req);
typedef int (*IrecvFn)(Out, Count, Handle, int, int, Handle, Req);
typedef int (*IsendrecvFn)(In, Count, Handle, int, int, Out, Count, Handle, int, int, Handle,
                           Req);
typedef int (*IbarrierFn)(Handle, Req);
/* the blocking calls, for communicators that ask for them */
typedef int (*AllreduceFn)(In, Out, Count, Handle, Handle, Handle);
typedef int (*BcastFn)(Out, Count, Handle, int, Handle);
typedef int (*ReduceFn)(In, Out, Count, Handle, Handle, int, Handle);
typedef int (*AllgatherFn)(In, Count, Handle, Out, Count, Handle, Handle);
typedef int (*RootedFn)(In, Count, Handle, Out, Count, Handle, int, Handle);
typedef int (*BarrierFn)(Handle);
typedef int (*SendrecvFn)(In, Count, Handle, int, int, Out, Count, Handle, int, int, Handle,
                          void *);
typedef int (*TestFn)(Req, int *, void *);
/* the persistent calls (MPI 4.0), each with an MPI_Info before its request */
typedef int (*AllreduceInitFn)(In, Out, Count, Handle, Handle, Handle, Handle, Req);
typedef int (*BcastInitFn)(Out, Count, Handle, int, Handle, Handle, Req);
typedef int (*ReduceInitFn)(In, Out, Count, Handle, Handle, int, Handle, Handle, Req);
typedef int (*AllgatherInitFn)(In, Count, Handle, Out, Count, Handle, Handle, Handle, Req);
typedef int (*RootedInitFn)(In, Count, Handle, Out, Count, Handle, int, Handle, Handle, Req);
typedef int (*BarrierInitFn)(Handle, Handle, Req);
typedef int (*RequestFn)(Req);
typedef int (*ReduceLocalFn)(In, Out, Count, Handle, Handle);

static void *calls[KINDS];        /* the non-blocking MPI call of each kind */
/* the blocking MPI call of each kind (those of send and recv unused) */
static void *blocking_calls[KINDS];
static TestFn mpi_test;
/* MPI_Ireduce_scatter(_c) and MPI_Reduce_scatter(_c): the reduce_scatter with counts */
static void *ireduce_scatter_v, *reduce_scatter_v;
static void *mpi_in_place;
static int tag;          /* the tag of send and recv */
static int exchange_tag; /* the tag of a two-rank reduce_scatter's exchange */
static ReduceLocalFn mpi_reduce_local;
/* the persistent call of each collective kind (0 for SEND, RECV, SENDRECV), MPI_Start,
 * MPI_Request_free, MPI_INFO_NULL; init_calls[ALL_REDUCE] 0: this MPI lacks one of them */
static void *init_calls[KINDS];
static RequestFn mpi_start, mpi_request_free;
static Handle info_null;

/* seconds of yielding polls before poll() hands a call back to the caller's wait */
#define HAND_BACK 0.01
/* tests between two yields of the core (a power of 2; _direct.YIELD_EVERY says why) */
#define YIELD_EVERY 8

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* mpi4py gives int handles sign-extended to 64 bits (their low 32 bits are the handle), and
 * pointer handles as their address. */
static Handle as_handle(unsigned long long v)
{
#ifdef FASTMPI_POINTER_HANDLES
    return (Handle)(uintptr_t)v;
#else
    return (Handle)(unsigned)v;
#endif
}

/* A call's send and recv as MPI takes them: None (NULL) is MPI_IN_PLACE where the call has an
 * in-place form (the scatter's is its recv). */
static const void *send_of(int kind, const void *send)
{
    return send != NULL ? send : kind == SCATTER ? NULL : mpi_in_place;
}

static void *recv_of(int kind, void *recv)
{
    return recv != NULL ? recv : kind == SCATTER ? mpi_in_place : NULL;
}

/* Primitives.post (_primitives.h) */
static int post(int kind, int blocking, unsigned long long comm_handle, const void *send,
                void *recv, long long count, unsigned long long datatype_handle,
                unsigned long long op_handle, int root, int source, const void *counts,
                unsigned long long *request_handle)
{
    Handle comm = as_handle(comm_handle), datatype = as_handle(datatype_handle);
    Handle op = as_handle(op_handle), request = 0;
    const void *s = send_of(kind, send);
    void *r = recv_of(kind, recv);
    Count n = (Count)count;
    void *f = calls[kind];
    int rc;
    *request_handle = 0;
    if (blocking && kind != SEND && kind != RECV) {
        int status[16]; /* MPI_Status: 20 bytes under the MPICH ABI, 24 under Open MPI's */
        f = blocking_calls[kind];
        switch (kind) {
        case SENDRECV:
            return ((SendrecvFn)f)(s, n, datatype, root, tag, r, n, datatype, source, tag,
                                   comm, status);
        case REDUCE_SCATTER:
            if (source >= 0)
                return ((SendrecvFn)blocking_calls[SENDRECV])(s, n, datatype, root,
                                                             exchange_tag, r, n, datatype,
                                                             source, exchange_tag, comm, status);
            if (counts != NULL)
                return ((ReduceScatterVFn)reduce_scatter_v)(s, r, counts, datatype, op, comm);
            return ((AllreduceFn)f)(s, r, n, datatype, op, comm);
        case ALL_REDUCE:
            return ((AllreduceFn)f)(s, r, n, datatype, op, comm);
        case BROADCAST:
            return ((BcastFn)f)(r, n, datatype, root, comm);
        case REDUCE:
            return ((ReduceFn)f)(s, r, n, datatype, op, root, comm);
        case ALL_GATHER:
        case ALL_TO_ALL:
            return ((AllgatherFn)f)(s, n, datatype, r, n, datatype, comm);
        case GATHER:
        case SCATTER:
            return ((RootedFn)f)(s, n, datatype, r, n, datatype, root, comm);
        default:
            return ((BarrierFn)f)(comm);
        }
    }
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
        if (source >= 0)
            rc = ((IsendrecvFn)calls[SENDRECV])(s, n, datatype, root, exchange_tag, r, n,
                                                datatype, source, exchange_tag, comm, &request);
        else if (counts != NULL)
            rc = ((IreduceScatterVFn)ireduce_scatter_v)(s, r, counts, datatype, op, comm,
                                                        &request);
        else
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
    case SENDRECV: /* the books post it only where setup() was given the call */
        rc = ((IsendrecvFn)f)(s, n, datatype, root, tag, r, n, datatype, source, tag, comm,
                              &request);
        break;
    default:
        rc = ((IbarrierFn)f)(comm, &request);
    }
    /* mpi4py takes handles sign-extended to 64 bits, as it gives them */
    *request_handle = (unsigned long long)(long long)request;
    return rc;
}

/* Primitives.poll (_primitives.h) */
static int poll(unsigned long long *request_handle, double yield_after, int *done)
{
    Handle request = as_handle(*request_handle);
    int status[16]; /* MPI_Status is 20 bytes under the MPICH ABI, 24 under Open MPI's */
    int rc;
    unsigned polls = 0;
    double start = now(), waited = 0.0;
    *done = 0;
    while ((rc = mpi_test(&request, done, status)) == 0 && !*done) {
        if (yield_after < 0) /* one test */
            break;
        /* then yield after every YIELD_EVERY tests, for a while (from the first where
         * yield_after is 0: a rank that shares its core with another) */
        if (waited >= yield_after) {
            if ((++polls & (YIELD_EVERY - 1)) == 0) {
                sched_yield();
                if ((waited = now() - start) > yield_after + HAND_BACK)
                    break;
            }
        } else if ((++polls & 255) == 0) {
            waited = now() - start;
        }
    }
    *request_handle = (unsigned long long)(long long)request;
    return rc;
}

/* Primitives.init (_primitives.h) */
static int init(int kind, unsigned long long comm_handle, const void *send, void *recv,
                long long count, unsigned long long datatype_handle,
                unsigned long long op_handle, int root, unsigned long long *request_handle)
{
    Handle comm = as_handle(comm_handle), datatype = as_handle(datatype_handle);
    Handle op = as_handle(op_handle), request = 0;
    const void *s = send_of(kind, send);
    void *r = recv_of(kind, recv);
    Count n = (Count)count;
    void *f = init_calls[kind];
    int rc;
    switch (kind) {
    case ALL_REDUCE:
    case REDUCE_SCATTER:
        rc = ((AllreduceInitFn)f)(s, r, n, datatype, op, comm, info_null, &request);
        break;
    case BROADCAST:
        rc = ((BcastInitFn)f)(r, n, datatype, root, comm, info_null, &request);
        break;
    case REDUCE:
        rc = ((ReduceInitFn)f)(s, r, n, datatype, op, root, comm, info_null, &request);
        break;
    case ALL_GATHER:
    case ALL_TO_ALL:
        rc = ((AllgatherInitFn)f)(s, n, datatype, r, n, datatype, comm, info_null, &request);
        break;
    case GATHER:
    case SCATTER:
        rc = ((RootedInitFn)f)(s, n, datatype, r, n, datatype, root, comm, info_null,
                               &request);
        break;
    default:
        rc = ((BarrierInitFn)f)(comm, info_null, &request);
    }
    *request_handle = (unsigned long long)(long long)request;
    return rc;
}

/* Primitives.start and Primitives.release (_primitives.h) */
static int start(unsigned long long *request_handle)
{
    Handle request = as_handle(*request_handle);
    return mpi_start(&request);
}

static int release(unsigned long long *request_handle)
{
    Handle request = as_handle(*request_handle);
    int rc = mpi_request_free(&request);
    *request_handle = (unsigned long long)(long long)request;
    return rc;
}

/* Primitives.reduce_local (_primitives.h) */
static int reduce_local(const void *in, void *inout, long long count,
                        unsigned long long datatype_handle, unsigned long long op_handle)
{
    return mpi_reduce_local(in, inout, (Count)count, as_handle(datatype_handle),
                            as_handle(op_handle));
}

static Primitives primitives = {post, poll, (int)sizeof(Count), NULL, start, release, NULL};

/* setup(addresses, in_place, tag, info_null, exchange_tag): addresses are the non-blocking
 * calls of each kind, then the blocking call of each kind, then MPI_Ireduce_scatter(_c) and
 * MPI_Reduce_scatter(_c), then MPI_Test, then the persistent call of each kind, MPI_Start,
 * MPI_Request_free and MPI_Reduce_local(_c). The sendrecv's may be 0 (an MPI before 4.0 has
 * no MPI_Isendrecv), and the persistent ones (then init is NULL); those of send, recv and
 * sendrecv are 0; MPI_Reduce_local(_c) may be 0 (then reduce_local is NULL). */
#define ADDRESSES (3 * KINDS + 6)
static PyObject *setup(PyObject *self, PyObject *args)
{
    PyObject *addresses;
    long long in_place;
    unsigned long long info;
    int the_tag, the_exchange_tag;
    (void)self;
    if (!PyArg_ParseTuple(args, "O!LiKi", &PyList_Type, &addresses, &in_place, &the_tag,
                          &info, &the_exchange_tag))
        return NULL;
    if (PyList_GET_SIZE(addresses) != ADDRESSES) {
        PyErr_Format(PyExc_ValueError, "setup: %d addresses expected", ADDRESSES);
        return NULL;
    }
    void *found[ADDRESSES];
    int persistent = 1;
    for (int i = 0; i < ADDRESSES; i++) {
        found[i] = PyLong_AsVoidPtr(PyList_GET_ITEM(addresses, i));
        if (found[i] == NULL && PyErr_Occurred())
            return NULL;
        int kind = i - 2 * KINDS - 3; /* of the persistent calls */
        if (found[i] == NULL && i == ADDRESSES - 1)
            continue;
        if (found[i] == NULL && kind >= 0) {
            persistent &= kind == SEND || kind == RECV || kind == SENDRECV;
            continue;
        }
        if (found[i] == NULL && i != SENDRECV && i != KINDS + SENDRECV) {
            PyErr_SetString(PyExc_ValueError, "setup: a null address");
            return NULL;
        }
    }
    for (int i = 0; i < KINDS; i++)
        init_calls[i] = found[2 * KINDS + 3 + i];
    mpi_start = (RequestFn)found[3 * KINDS + 3];
    mpi_request_free = (RequestFn)found[3 * KINDS + 4];
    mpi_reduce_local = (ReduceLocalFn)found[3 * KINDS + 5];
    primitives.reduce_local = mpi_reduce_local != NULL ? reduce_local : NULL;
    info_null = as_handle(info);
    primitives.init = persistent && mpi_start && mpi_request_free ? init : NULL;
    for (int i = 0; i < KINDS; i++) {
        calls[i] = found[i];
        blocking_calls[i] = found[KINDS + i];
    }
    ireduce_scatter_v = found[2 * KINDS];
    reduce_scatter_v = found[2 * KINDS + 1];
    mpi_test = (TestFn)found[2 * KINDS + 2];
    mpi_in_place = (void *)(intptr_t)in_place;
    tag = the_tag;
    exchange_tag = the_exchange_tag;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"setup", setup, METH_VARARGS, "setup(addresses, in_place, tag, info_null, exchange_tag)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, MODULE_NAME, NULL, -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC MODULE_INIT(void)
{
    PyObject *m = PyModule_Create(&module);
    PyObject *capsule = m == NULL ? NULL
                                  : PyCapsule_New((void *)&primitives, PRIMITIVES_CAPSULE, NULL);
    if (capsule == NULL || PyModule_AddObject(m, "primitives", capsule) < 0) {
        Py_XDECREF(capsule);
        Py_XDECREF(m);
        return NULL;
    }
    return m;
}
