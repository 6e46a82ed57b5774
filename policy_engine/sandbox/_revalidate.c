/* The stored mask walk's revalidation loop, native (policy_engine/sandbox/revalidate.py).
 *
 * A fresh engine reuses the last run's walk of the system trees (~26,000 directories) only
 * after every directory is checked against the (st_dev, st_ino, st_ctime_ns) it had when it
 * was listed. In Python that loop costs ≈ 3 µs a directory (os.lstat builds a stat_result,
 * ctypes marshals inotify_add_watch); here it is the two syscalls, with the GIL released and
 * the directories split over two threads. revalidate.py holds the same loop in Python where
 * this is not built; tests/unit/test_revalidate.py runs both on the same trees.
 *
 * changed(paths: bytes, stamps: bytes, inotify_fd: int, mask: int) -> (list[int], bytes)
 *   paths   every directory, each followed by one NUL byte (os.fsencode's bytes)
 *   stamps  3 native uint64 a directory: st_dev, st_ino, st_ctime_ns as when it was listed
 *           ((0, 0, 0): never trusted, always reported)
 *   inotify_fd, mask  >= 0: each directory is watched with `mask` *before* its lstat, so a
 *           change after the check is an inotify event and a change before it is a changed
 *           stamp (INVARIANT of watch.py); -1: no watches
 *   returns the indexes of the paths whose stamp no longer holds or that are gone, in order
 *   (a directory replaced by a file or a link has another inode; a start root that is a link,
 *   /bin -> usr/bin, is stamped as the link), and one native int32 a path: the watch
 *   descriptor, or -errno when inotify_add_watch failed (0 when not watching)
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_THREADS 2
#define MIN_SHARE 2048 /* fewer directories than this a thread: not worth a thread */

struct share {
    const char *const *paths;
    const uint64_t *stamps;
    int32_t *wds;
    unsigned char *changed;
    Py_ssize_t lo, hi;
    int fd;
    uint32_t mask;
};

static void *
check(void *arg)
{
    struct share *s = arg;
    struct stat sb;
    for (Py_ssize_t i = s->lo; i < s->hi; i++) {
        const char *path = s->paths[i];
        const uint64_t *want = s->stamps + 3 * i;
        if (s->fd >= 0) {
            int wd = inotify_add_watch(s->fd, path, s->mask);
            s->wds[i] = wd >= 0 ? wd : -errno;
        }
        uint64_t ctime_ns;
        if (lstat(path, &sb) != 0) {
            s->changed[i] = 1;
            continue;
        }
        ctime_ns = (uint64_t)sb.st_ctim.tv_sec * 1000000000u + (uint64_t)sb.st_ctim.tv_nsec;
        s->changed[i] = want[0] != (uint64_t)sb.st_dev || want[1] != (uint64_t)sb.st_ino ||
                        want[2] != ctime_ns || want[1] == 0;
    }
    return NULL;
}

static PyObject *
changed(PyObject *module, PyObject *args)
{
    Py_buffer paths, stamps;
    int fd;
    unsigned int mask;
    PyObject *result = NULL, *indexes = NULL, *wd_bytes = NULL;
    const char **starts = NULL;
    unsigned char *flags = NULL;
    uint64_t *want = NULL;
    Py_ssize_t n = 0;

    (void)module;
    if (!PyArg_ParseTuple(args, "y*y*iI", &paths, &stamps, &fd, &mask))
        return NULL;
    /* the directories: one NUL after each, so the last byte is a NUL */
    for (Py_ssize_t i = 0; i < paths.len; i++)
        n += ((const char *)paths.buf)[i] == '\0';
    if ((paths.len > 0 && ((const char *)paths.buf)[paths.len - 1] != '\0') ||
        stamps.len != n * 3 * (Py_ssize_t)sizeof(uint64_t) || stamps.len % sizeof(uint64_t)) {
        PyErr_SetString(PyExc_ValueError, "paths and stamps do not match");
        goto done;
    }
    starts = PyMem_Malloc(sizeof(char *) * (size_t)(n ? n : 1));
    flags = PyMem_Calloc((size_t)(n ? n : 1), 1);
    wd_bytes = PyBytes_FromStringAndSize(NULL, n * (Py_ssize_t)sizeof(int32_t));
    if (starts == NULL || flags == NULL || wd_bytes == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    memset(PyBytes_AS_STRING(wd_bytes), 0, (size_t)n * sizeof(int32_t));
    {
        const char *p = paths.buf;
        for (Py_ssize_t i = 0; i < n; i++) {
            starts[i] = p;
            p += strlen(p) + 1;
        }
    }
    /* an aligned copy of the stamps: a bytes object's buffer is, an arbitrary buffer may not */
    want = PyMem_Malloc(stamps.len ? (size_t)stamps.len : 1);
    if (want == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    memcpy(want, stamps.buf, (size_t)stamps.len);
    {
        struct share shares[MAX_THREADS];
        pthread_t threads[MAX_THREADS];
        int started[MAX_THREADS] = {0};
        long cpus = sysconf(_SC_NPROCESSORS_ONLN);
        int t = (int)(n / MIN_SHARE);
        if (t > MAX_THREADS)
            t = MAX_THREADS;
        if (t > cpus)
            t = (int)cpus;
        if (t < 1)
            t = 1;
        for (int k = 0; k < t; k++) {
            shares[k] = (struct share){starts, want, (int32_t *)PyBytes_AS_STRING(wd_bytes), flags,
                                       n * k / t, n * (k + 1) / t, fd, (uint32_t)mask};
        }
        Py_BEGIN_ALLOW_THREADS
        for (int k = 1; k < t; k++)
            started[k] = pthread_create(&threads[k], NULL, check, &shares[k]) == 0;
        check(&shares[0]);
        for (int k = 1; k < t; k++) {
            if (started[k])
                pthread_join(threads[k], NULL);
            else
                check(&shares[k]); /* no thread: this one does the share */
        }
        Py_END_ALLOW_THREADS
    }
    indexes = PyList_New(0);
    if (indexes == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!flags[i])
            continue;
        PyObject *v = PyLong_FromSsize_t(i);
        if (v == NULL || PyList_Append(indexes, v) < 0) {
            Py_XDECREF(v);
            goto done;
        }
        Py_DECREF(v);
    }
    result = PyTuple_Pack(2, indexes, wd_bytes);
done:
    Py_XDECREF(indexes);
    Py_XDECREF(wd_bytes);
    PyMem_Free(starts);
    PyMem_Free(flags);
    PyMem_Free(want);
    PyBuffer_Release(&paths);
    PyBuffer_Release(&stamps);
    return result;
}

static PyMethodDef methods[] = {
    {"changed", changed, METH_VARARGS,
     "changed(paths, stamps, inotify_fd, mask) -> (indexes, wds): see _revalidate.c"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_revalidate", "The stored mask walk's revalidation loop.", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__revalidate(void)
{
    return PyModule_Create(&module);
}
