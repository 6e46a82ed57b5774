/* The openat2 probe of guard/nofollow.py, native: one call from Python into the syscall.
 *
 * nofollow.py documents the contract; this is the same function without ctypes, which spends
 * ≈ 0.4 µs marshalling five arguments and fetching errno around a ≈ 0.3 µs syscall on every fs
 * decision. Built as an optional extension (setup.py); where it is not built, nofollow.py's
 * ctypes probe answers alike (tests/unit/test_guard_matchers.py runs both on the same paths).
 *
 * probe(path: str, with_stat: bool = False) -> (answer, (st_mode, st_size) | None)
 *   answer 0 NO_LINK: every component exists and none is a symlink (the descriptor is closed;
 *            with with_stat, its fstat first: what lstat would say of the path; a failing
 *            fstat answers UNKNOWN)
 *          1 MISSING: a component is missing and none before it is a link
 *          2 UNKNOWN: a link, any other error, or no openat2 on this kernel (ENOSYS: never
 *            asked again)
 *   The path is encoded as os functions encode it (the file system encoding, surrogateescape);
 *   a NUL in it raises ValueError, as os functions do, rather than probing a shorter path.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef SYS_openat2
#define SYS_openat2 437 /* the same number on x86_64 and aarch64 */
#endif

/* struct open_how and its flags from linux/openat2.h, spelt out for older kernel headers */
struct pe_open_how {
    uint64_t flags;
    uint64_t mode;
    uint64_t resolve;
};
#define PE_RESOLVE_NO_MAGICLINKS 0x02
#define PE_RESOLVE_NO_SYMLINKS 0x04

static int no_openat2; /* set on ENOSYS: an old kernel or a seccomp filter hiding openat2 */
static PyObject *answer_no_link, *answer_missing, *answer_unknown; /* (n, None), built once */

static PyObject *
probe(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *path_arg, *encoded = NULL;
    int with_stat = 0;
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    long fd;
    int err;
    struct pe_open_how how;
    struct stat sb;
    int stat_failed = 0;

    (void)module;
    if (nargs < 1 || nargs + nkw > 2) {
        PyErr_SetString(PyExc_TypeError, "probe(path, with_stat=False)");
        return NULL;
    }
    if (nkw == 1 &&
        PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(kwnames, 0), "with_stat") != 0) {
        PyErr_SetString(PyExc_TypeError, "probe() got an unexpected keyword argument");
        return NULL;
    }
    path_arg = args[0];
    if (!PyUnicode_Check(path_arg)) {
        PyErr_SetString(PyExc_TypeError, "probe() path must be a str");
        return NULL;
    }
    if (nargs + nkw == 2) {
        with_stat = PyObject_IsTrue(args[1]);
        if (with_stat < 0)
            return NULL;
    }
    if (no_openat2)
        return Py_NewRef(answer_unknown);
    if (!PyUnicode_FSConverter(path_arg, &encoded)) /* refuses an embedded NUL */
        return NULL;

    memset(&how, 0, sizeof how);
    how.flags = O_PATH | O_CLOEXEC;
    how.resolve = PE_RESOLVE_NO_SYMLINKS | PE_RESOLVE_NO_MAGICLINKS;
    /* the GIL is released as ctypes releases it: a slow file system stalls only this call */
    Py_BEGIN_ALLOW_THREADS
    fd = syscall(SYS_openat2, AT_FDCWD, PyBytes_AS_STRING(encoded), &how, sizeof how);
    err = errno;
    if (fd >= 0) {
        if (with_stat && fstat((int)fd, &sb) != 0)
            stat_failed = 1;
        close((int)fd);
    }
    Py_END_ALLOW_THREADS
    Py_DECREF(encoded);

    if (fd >= 0) {
        if (!with_stat)
            return Py_NewRef(answer_no_link);
        if (stat_failed) /* the caller walks the path instead */
            return Py_NewRef(answer_unknown);
        return Py_BuildValue("(i(KL))", 0, (unsigned long long)sb.st_mode,
                             (long long)sb.st_size);
    }
    if (err == ENOENT)
        return Py_NewRef(answer_missing);
    if (err == ENOSYS)
        no_openat2 = 1;
    return Py_NewRef(answer_unknown);
}

static PyObject *
available(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    return PyBool_FromLong(!no_openat2);
}

static PyMethodDef methods[] = {
    {"probe", (PyCFunction)(void (*)(void))probe, METH_FASTCALL | METH_KEYWORDS,
     "probe(path, with_stat=False) -> (answer, stat or None): see guard/nofollow.py"},
    {"available", available, METH_NOARGS,
     "Whether openat2 has not answered ENOSYS here."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    .m_base = PyModuleDef_HEAD_INIT,
    .m_name = "_nofollow",
    .m_doc = "The openat2 probe of policy_engine.guard.nofollow, without ctypes.",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC
PyInit__nofollow(void)
{
    answer_no_link = Py_BuildValue("(iO)", 0, Py_None);
    answer_missing = Py_BuildValue("(iO)", 1, Py_None);
    answer_unknown = Py_BuildValue("(iO)", 2, Py_None);
    if (answer_no_link == NULL || answer_missing == NULL || answer_unknown == NULL)
        return NULL;
    return PyModule_Create(&module_def);
}
