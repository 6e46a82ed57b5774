/* sb_launch: the native proc launcher. Applies what its options ask for, then execvp's the rest.
 *
 * Built on first use by plugins/executor_proc/native.py (musl-gcc where installed, else gcc;
 * cached by this file's sha256 and the tool chain).
 * The same binary serves two places, always given its options by the engine (never by a tool):
 *
 *   on the host, before bwrap:   -c FD (cgroup.procs to join)  -r RES:SOFT:HARD (setrlimit)
 *                                -H FD (held: after joining, wait for the real command on FD)
 *                                -x FD (close FD before exec: a status pipe nobody inside reports to)
 *                                -o N:PATH (stage PATH at STAGE_DIR/N: a bind source whose parents
 *                                   the sandbox uid cannot traverse, bound there by root in a
 *                                   private mount namespace so bwrap can bind it from there)
 *                                -m DIR (then cover DIR, closed to the sandbox uid, by an empty
 *                                   tmpfs) -b N:DEST (then bind staged N at DEST inside it, and
 *                                   detach the stage: proc-landlock, which has no bwrap)
 *                                -M DIR (last, cover DIR, a masked directory, by an empty tmpfs:
 *                                   Landlock's list right on a carved parent reaches the names
 *                                   inside; one already gone or hidden is skipped)
 *                                -I (a fresh IPC namespace: no SysV object or POSIX queue of
 *                                   another call or of the host is visible; proc-landlock)
 *                                -u UID:GID (then become UID:GID, no supplementary groups: bwrap
 *                                   and everything it starts run as that unprivileged host uid)
 *   in the sandbox, before tool: -s FD (status)  -C (drop caps)  -l/-L (Landlock, required)
 *                                -t (deny TCP)  -S (scope)  -p MASK:PATH (rule)
 *                                -P PORT / -B PORT (with -t: allow TCP connect / bind to PORT)
 *                                -N (Landlock handles no filesystem right: a network-only layer)
 *                                -k (keep the status FD open for the next launcher in the chain)
 *                                -f HEX / -F HEX (seccomp BPF program, required)
 *                                -i (stay as an init: fork the tool, reap every orphan, exit
 *                                   with its status, 128 + N for signal N; proc-unshare, where the
 *                                   launcher is pid 1 of a pid namespace, which ignores signals it
 *                                   has no handler for and would leave zombies)
 *                                -w (with -s: fork the tool too, keep the status FD, closed to the
 *                                   tool, and append {"tool_end": {"signal": N}} or
 *                                   {"tool_end": {"exit": N}} when it ends; exit as -i does. The
 *                                   engine's own wait sees bwrap's or the init's 128 + N, which a
 *                                   tool can also exit with: this tells the two apart)
 *                                -W FD (with -s: what -w is for, without the fork: send a pidfd of
 *                                   this process on FD, a Unix socket to the engine, close FD, exec
 *                                   the tool in place; the engine reads how the tool ended from the
 *                                   pidfd once it is reaped (PIDFD_INFO_EXIT, Linux 6.15), which
 *                                   tells a signal from an exit as the -w report does. When the
 *                                   pidfd cannot be sent, -w's fork and report instead)
 *
 * Held mode lets the engine spawn launchers ahead of time (each already in its own cgroup: the
 * migration costs an RCU grace period, 5-15 ms, so it is paid off the hot path). The message on
 * FD, read to EOF, is NUL-separated: cwd, environment entries, an empty string, then the options
 * and command exactly as they would follow on the command line. EOF with no message: exit 0.
 *
 * It mirrors launcher.py, landlock.py and seccomp.py (which remain the reference and the
 * fallback): caps are dropped first, then Landlock (ABI probe; rights masked to what the ABI
 * handles; file-only rights on files; missing paths skipped; TCP from ABI 4, scoping from ABI 6),
 * then NO_NEW_PRIVS and the seccomp filter built by seccomp.build_filter. The status written to
 * -s is the same JSON the Python launcher writes. Exit 126: isolation could not be applied;
 * 127: the program could not be executed.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <sys/mount.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

#define NR_CREATE_RULESET 444
#define NR_ADD_RULE 445
#define NR_RESTRICT_SELF 446
#define CREATE_RULESET_VERSION 1u
#define RULE_PATH_BENEATH 1
#define RULE_NET_PORT 2
#define FILE_ONLY ((1ull << 0) | (1ull << 1) | (1ull << 2) | (1ull << 14) | (1ull << 15))
#define NET_BIND_TCP (1ull << 0)
#define NET_CONNECT_TCP (1ull << 1)
#define SCOPE_ABSTRACT_UNIX (1ull << 0)
#define SCOPE_SIGNAL (1ull << 1)
#define MAX_RULES 4096
#define MAX_FDS 16
#define MAX_PORTS 8
#define MAX_OPENS 512
#define STAGE_DIR "/run/policy-engine-stage" /* under /run: every sandbox masks it */

struct ruleset_attr { uint64_t fs, net, scoped; };
struct path_beneath { uint64_t allowed_access; int32_t parent_fd; } __attribute__((packed));

struct net_port { uint64_t allowed_access; uint64_t port; };

struct rule { uint64_t mask; const char *path; };

static uint64_t ports[MAX_PORTS], port_access[MAX_PORTS];
static int nports, net_only;

static char status[8192];
static size_t status_len;

static void put(const char *s) {
    size_t n = strlen(s);
    if (status_len + n < sizeof status) {
        memcpy(status + status_len, s, n);
        status_len += n;
    }
}

/* a JSON string body: quotes, backslashes and control characters escaped */
static void put_escaped(const char *s) {
    char buf[8];
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') { buf[0] = '\\'; buf[1] = (char)c; buf[2] = 0; }
        else if (c < 0x20) snprintf(buf, sizeof buf, "\\u%04x", c);
        else { buf[0] = (char)c; buf[1] = 0; }
        put(buf);
    }
}

/* One isolation layer's status: "unavailable: [Errno N] why" (rc < 0), else
 * "enforced (<label> <value>)" or "enforced (<value> <label>)" as the caller words it. */
static void put_layer(int rc, const char *what, const char *before, int value, const char *after) {
    char buf[64];
    if (rc < 0) {
        snprintf(buf, sizeof buf, "unavailable: [Errno %d] ", -rc);
        put(buf);
        put_escaped(what);
        return;
    }
    snprintf(buf, sizeof buf, "%d", value);
    put(before);
    put(buf);
    put(after);
}

static void write_all(int fd, const char *p, size_t n) {
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return;
        p += w;
        n -= (size_t)w;
    }
}

static int status_fd = -1;

/* execvp with glibc's rules whichever C library built this (the launcher is built with musl
 * where it is installed: a glibc program's start costs ~0.5 ms of CPUID traps on a VM, musl's
 * ~0.05 ms). glibc's rules, kept so a tool runs the same on every host: a name with a slash is
 * run as is; else each PATH entry in turn (no PATH: /bin:/usr/bin; an empty entry: the
 * directory we are in), going on past ENOENT, ENOTDIR, ESTALE, ENODEV, ETIMEDOUT and EACCES
 * (which is reported if nothing ran); a file the kernel cannot run (ENOEXEC: a script without
 * #!) is run by /bin/sh. musl's execvp has no /bin/sh fallback and another default PATH. */
static void exec_script(const char *file, char *const argv[]) {
    int n = 0;
    while (argv[n]) n++;
    char **sh = malloc(sizeof(char *) * (size_t)(n + 2));
    if (!sh) return;
    sh[0] = (char *)"/bin/sh";
    sh[1] = (char *)file;
    for (int i = 1; i <= n; i++) sh[i + 1] = argv[i];
    execve("/bin/sh", sh, environ);
    free(sh);
    errno = ENOEXEC;
}

static int pe_execvp(const char *file, char *const argv[]) {
    if (!*file) { errno = ENOENT; return -1; }
    if (strchr(file, '/')) {
        execve(file, argv, environ);
        if (errno == ENOEXEC) exec_script(file, argv);
        return -1;
    }
    size_t flen = strlen(file) + 1;
    if (flen > 255) { errno = ENAMETOOLONG; return -1; } /* NAME_MAX, as glibc counts */
    const char *path = getenv("PATH");
    if (!path) path = "/bin:/usr/bin";
    int eacces = 0;
    char buf[4096 + 256 + 1];
    for (const char *p = path;; p++) {
        const char *end = strchrnul(p, ':');
        size_t dlen = (size_t)(end - p);
        if (dlen < 4096) {
            memcpy(buf, p, dlen);
            buf[dlen] = '/';
            memcpy(buf + dlen + (dlen ? 1 : 0), file, flen); /* "" is the directory we are in */
            execve(buf, argv, environ);
            if (errno == ENOEXEC) exec_script(buf, argv);
            switch (errno) {
            case EACCES: eacces = 1; break;
            case ENOENT: case ENOTDIR: case ESTALE: case ENODEV: case ETIMEDOUT: break;
            default: return -1;
            }
        }
        if (!*end) break;
        p = end;
    }
    if (eacces) errno = EACCES; /* else the last entry's error, as glibc */
    return -1;
}

static void fail(int err, const char *what, const char *path) {
    char num[32];
    if (status_fd >= 0) {
        status_len = 0;
        snprintf(num, sizeof num, "[Errno %d] ", err);
        put("{\"error\": \"");
        put(num);
        put_escaped(what);
        if (path) { put(" for "); put_escaped(path); }
        put("\"}");
        write_all(status_fd, status, status_len);
    } else {
        fprintf(stderr, "policy-engine launcher: %s%s%s: %s\n", what, path ? " for " : "",
                path ? path : "", strerror(err));
    }
    _exit(126);
}

static int landlock_abi(void) {
    long v = syscall(NR_CREATE_RULESET, NULL, (size_t)0, CREATE_RULESET_VERSION);
    return v > 0 ? (int)v : 0;
}

static uint64_t handled_fs(int abi) {
    if (abi <= 0) return 0;
    if (abi == 1) return (1ull << 13) - 1;
    if (abi == 2) return (1ull << 14) - 1;
    if (abi <= 4) return (1ull << 15) - 1;
    return (1ull << 16) - 1;
}

/* 0 and the ABI on success; -errno and *what set on failure */

/* A rule's path must not cross a symlink: a link planted in a writable tree (by this call or a
 * concurrent one) would otherwise make the rule grant its target (/etc, a secret, anything).
 * openat2(RESOLVE_NO_SYMLINKS) refuses a link in any component; kernels before 5.6 get
 * O_NOFOLLOW (last component only; the plan itself never lists a link). */
#ifndef SYS_openat2
#define SYS_openat2 437
#endif
struct pe_open_how { uint64_t flags, mode, resolve; };
static int open_nofollow(const char *path) {
    struct pe_open_how how = {O_PATH | O_CLOEXEC, 0, 0x04 /* RESOLVE_NO_SYMLINKS */};
    int fd = (int)syscall(SYS_openat2, AT_FDCWD, path, &how, sizeof how);
    if (fd >= 0 || (errno != ENOSYS && errno != E2BIG && errno != EINVAL)) return fd;
    return open(path, O_PATH | O_NOFOLLOW | O_CLOEXEC);
}

static int landlock_apply(struct rule *rules, int n, int deny_tcp, int scope, int *abi_out,
                          const char **what, const char **path) {
    int abi = landlock_abi();
    *abi_out = abi;
    if (abi <= 0) { *what = "landlock is not supported by this kernel"; return -EOPNOTSUPP; }
    uint64_t fs = net_only ? 0 : handled_fs(abi);
    if (net_only && !(deny_tcp && abi >= 4)) { *what = "landlock TCP rules need ABI 4"; return -EOPNOTSUPP; }
    struct ruleset_attr attr = {
        fs, deny_tcp && abi >= 4 ? (NET_BIND_TCP | NET_CONNECT_TCP) : 0,
        scope && abi >= 6 ? (SCOPE_ABSTRACT_UNIX | SCOPE_SIGNAL) : 0};
    size_t size = abi >= 6 ? 24 : abi >= 4 ? 16 : 8;
    int rfd = (int)syscall(NR_CREATE_RULESET, &attr, size, 0u);
    if (rfd < 0) { *what = "landlock_create_ruleset failed"; return -errno; }
    for (int i = 0; deny_tcp && abi >= 4 && i < nports; i++) {
        struct net_port np = {port_access[i], ports[i]};
        if (syscall(NR_ADD_RULE, rfd, RULE_NET_PORT, &np, 0u) != 0) {
            int e = errno;
            close(rfd);
            *what = "landlock_add_rule failed for a TCP port";
            return -e;
        }
    }
    for (int i = 0; i < n; i++) {
        int pfd = open_nofollow(rules[i].path);
        if (pfd < 0) continue; /* absent, or reached through a symlink: nothing to allow */
        struct stat st;
        uint64_t access = rules[i].mask & fs;
        if (fstat(pfd, &st) != 0 || S_ISLNK(st.st_mode)) access = 0;
        else if (!S_ISDIR(st.st_mode)) access &= FILE_ONLY;
        if (access != 0) {
            struct path_beneath pb = {access, pfd};
            if (syscall(NR_ADD_RULE, rfd, RULE_PATH_BENEATH, &pb, 0u) != 0) {
                int e = errno;
                close(pfd);
                close(rfd);
                *what = "landlock_add_rule failed";
                *path = rules[i].path;
                return -e;
            }
        }
        close(pfd);
    }
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) {
        int e = errno;
        close(rfd);
        *what = "PR_SET_NO_NEW_PRIVS failed";
        return -e;
    }
    if (syscall(NR_RESTRICT_SELF, rfd, 0u) != 0) {
        int e = errno;
        close(rfd);
        *what = "landlock_restrict_self failed";
        return -e;
    }
    close(rfd);
    return 0;
}

static int drop_caps(void) {
    for (int cap = 0; cap <= 63; cap++) prctl(PR_CAPBSET_DROP, cap, 0, 0, 0); /* EINVAL past last */
    prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0);
    struct __user_cap_header_struct hdr = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct data[2];
    memset(data, 0, sizeof data);
    return (int)syscall(SYS_capset, &hdr, data);
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* 0 and the program length; -errno and *what on failure */
static int seccomp_apply(const char *hex, int *len_out, const char **what) {
#if defined(__x86_64__)
    static struct sock_filter prog[4096];
    size_t n = strlen(hex);
    if (n == 0 || n % 16 != 0 || n / 16 > 4096) { *what = "seccomp program malformed"; return -EINVAL; }
    unsigned char *bytes = (unsigned char *)prog;
    for (size_t i = 0; i < n; i += 2) {
        int hi = hexval(hex[i]), lo = hexval(hex[i + 1]);
        if (hi < 0 || lo < 0) { *what = "seccomp program malformed"; return -EINVAL; }
        bytes[i / 2] = (unsigned char)(hi << 4 | lo);
    }
    struct sock_fprog fprog = {(unsigned short)(n / 16), prog};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) { *what = "PR_SET_NO_NEW_PRIVS failed"; return -errno; }
    if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &fprog, 0, 0) != 0) { *what = "PR_SET_SECCOMP failed"; return -errno; }
    *len_out = (int)(n / 16);
    return 0;
#else
    (void)hex;
    (void)len_out;
    *what = "seccomp filter has no table for this architecture";
    return -ENOSYS;
#endif
}

static void usage(void) {
    fprintf(stderr, "usage: sb_launch [-c FD] [-r RES:SOFT:HARD] [-s FD] [-C] [-l|-L] [-t] [-S] "
                    "[-p MASK:PATH] [-P PORT] [-B PORT] [-N] [-k] [-f|-F HEX] -- PROGRAM ARGS...\n");
    _exit(126);
}

static unsigned long long num(const char *s, char **end) {
    errno = 0;
    unsigned long long v = strtoull(s, end, 10);
    if (errno != 0 || *end == s) usage();
    return v;
}

static struct rule rules[MAX_RULES];
static int nrules, cg_fds[MAX_FDS], ncg, hold_fd = -1;
static int open_idx[MAX_OPENS], nopens, cover_n, rebind_idx[MAX_OPENS], nrebinds, nhides;
static const char *open_paths[MAX_OPENS], *covers[MAX_OPENS], *rebinds[MAX_OPENS];
static const char *hides[MAX_OPENS];
static long run_uid = -1, run_gid = -1;
static int new_ipc;
static int as_init, report_end, end_fd = -1;
static int want_ll, ll_required, deny_tcp, scope, caps, sc_required, keep_status;
static const char *seccomp_hex;

static void parse(int argc, char **argv) {
    int opt;
    char *end;
    optind = 0; /* glibc: full re-initialisation, so held mode can parse a second argv */
    while ((opt = getopt(argc, argv, "+c:r:s:H:x:o:m:M:b:u:IiwW:ClLtSp:P:B:Nkf:F:")) != -1) {
        switch (opt) {
        case 'x': close((int)num(optarg, &end)); break;
        case 'H': hold_fd = (int)num(optarg, &end); break;
        case 'c':
            if (ncg == MAX_FDS) usage();
            cg_fds[ncg++] = (int)num(optarg, &end);
            break;
        case 'r': {
            int res = (int)num(optarg, &end);
            if (*end != ':') usage();
            struct rlimit rl;
            rl.rlim_cur = (rlim_t)num(end + 1, &end);
            if (*end != ':') usage();
            rl.rlim_max = (rlim_t)num(end + 1, &end);
            if (setrlimit(res, &rl) != 0) fail(errno, "setrlimit failed", NULL);
            break;
        }
        case 'o':
            if (nopens == MAX_OPENS) usage();
            open_idx[nopens] = (int)num(optarg, &end);
            if (*end != ':' || end[1] != '/') usage();
            open_paths[nopens++] = end + 1;
            break;
        case 'I': new_ipc = 1; break;
        case 'M':
            if (nhides == MAX_OPENS || optarg[0] != '/') usage();
            hides[nhides++] = optarg;
            break;
        case 'i': as_init = 1; break;
        case 'w': report_end = 1; break;
        case 'W': end_fd = (int)num(optarg, &end); break;
        case 'm':
            if (cover_n == MAX_OPENS || optarg[0] != '/') usage();
            covers[cover_n++] = optarg;
            break;
        case 'b':
            if (nrebinds == MAX_OPENS) usage();
            rebind_idx[nrebinds] = (int)num(optarg, &end);
            if (*end != ':' || end[1] != '/') usage();
            rebinds[nrebinds++] = end + 1;
            break;
        case 'u':
            run_uid = (long)num(optarg, &end);
            if (*end != ':') usage();
            run_gid = (long)num(end + 1, &end);
            if (*end != 0 || run_uid <= 0 || run_gid <= 0) usage(); /* never back to root */
            break;
        case 's': status_fd = (int)num(optarg, &end); break;
        case 'C': caps = 1; break;
        case 'L': ll_required = 1; /* fall through */
        case 'l': want_ll = 1; break;
        case 't': deny_tcp = 1; break;
        case 'S': scope = 1; break;
        case 'p':
            if (nrules == MAX_RULES) usage();
            rules[nrules].mask = num(optarg, &end);
            if (*end != ':') usage();
            rules[nrules++].path = end + 1;
            break;
        case 'P': /* fall through */
        case 'B':
            if (nports == MAX_PORTS) usage();
            ports[nports] = num(optarg, &end);
            if (*end != 0 || ports[nports] > 65535) usage();
            port_access[nports++] = opt == 'P' ? NET_CONNECT_TCP : NET_BIND_TCP;
            break;
        case 'N': net_only = 1; break;
        case 'k': keep_status = 1; break;
        case 'F': sc_required = 1; /* fall through */
        case 'f': seccomp_hex = optarg; break;
        default: usage();
        }
    }
}

/* Bind every -o source at STAGE_DIR/N in a private mount namespace of this process (root still):
 * bwrap, run as the sandbox uid, resolves its sources by path, and a source below a directory
 * closed to that uid (/root/..., pytest's 0700 tmp, the 0700 launcher cache) would fail. The
 * staged copy is reachable (STAGE_DIR is 0755); it dies with the namespace. */
/* mkdir -p the parents of DEST (inside a cover tmpfs), then DEST itself (a file for a file) */
static void make_point(const char *dest, int dir) {
    char buf[4096];
    if (strlen(dest) >= sizeof buf) fail(ENAMETOOLONG, "mount point", dest);
    strcpy(buf, dest);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(buf, 0755) != 0 && errno != EEXIST) fail(errno, "mkdir failed", buf);
        *p = '/';
    }
    int rc = dir ? mkdir(buf, 0755) : close(open(buf, O_CREAT | O_WRONLY | O_CLOEXEC, 0644));
    if (rc != 0 && errno != EEXIST) fail(errno, "cannot make a mount point", buf);
}

static void stage(void) {
    char where[64];
    if (unshare(CLONE_NEWNS) != 0) fail(errno, "unshare(CLONE_NEWNS) failed", NULL);
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0)
        fail(errno, "cannot make the mounts private", NULL);
    if (nopens > 0 && mkdir(STAGE_DIR, 0755) != 0 && errno != EEXIST)
        fail(errno, "mkdir failed", STAGE_DIR);
    if (nopens > 0 &&
        mount("pe-stage", STAGE_DIR, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=64k") != 0)
        fail(errno, "cannot mount the staging tmpfs", STAGE_DIR);
    for (int i = 0; i < nopens; i++) {
        /* through a descriptor opened with no symlink on the path: a directory swapped for a
         * link since the plan fails the call rather than stage the link's target */
        struct stat st;
        char src[64];
        int sfd = open_nofollow(open_paths[i]);
        if (sfd < 0 || fstat(sfd, &st) != 0)
            fail(errno, "a bind source is gone or has a symlink on its path", open_paths[i]);
        snprintf(src, sizeof src, "/proc/self/fd/%d", sfd);
        snprintf(where, sizeof where, STAGE_DIR "/%d", open_idx[i]);
        int made = S_ISDIR(st.st_mode) ? mkdir(where, 0755)
                                       : close(open(where, O_CREAT | O_EXCL | O_WRONLY, 0644));
        if (made != 0) fail(errno, "cannot make a staging mount point", where);
        if (mount(src, where, NULL, MS_BIND | MS_REC, NULL) != 0)
            fail(errno, "cannot stage a bind source", open_paths[i]);
        close(sfd);
    }
    for (int i = 0; i < cover_n; i++)
        if (mount("pe-cover", covers[i], "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=64k") != 0)
            fail(errno, "cannot cover a closed directory", covers[i]);
    for (int i = 0; i < nrebinds; i++) {
        struct stat st;
        snprintf(where, sizeof where, STAGE_DIR "/%d", rebind_idx[i]);
        if (stat(where, &st) != 0) fail(errno, "cannot stat a staged source", where);
        make_point(rebinds[i], S_ISDIR(st.st_mode));
        if (mount(where, rebinds[i], NULL, MS_BIND | MS_REC, NULL) != 0)
            fail(errno, "cannot bind a staged source", rebinds[i]);
    }
    /* the stage itself is not for the tool (it may hold a bind's masked paths) */
    if (nrebinds > 0 && umount2(STAGE_DIR, MNT_DETACH) != 0)
        fail(errno, "cannot detach the stage", STAGE_DIR);
    /* after the binds back: a masked directory may lie inside one; the mount follows no path
     * the tool chose (it has not run yet) and could only hide more from it */
    for (int i = 0; i < nhides; i++)
        if (mount("pe-mask", hides[i], "tmpfs", MS_NOSUID | MS_NODEV | MS_RDONLY,
                  "mode=0755,size=4k") != 0 && errno != ENOENT && errno != ENOTDIR)
            fail(errno, "cannot cover a masked directory", hides[i]);
}

/* held mode: read the message, chdir, set the environment; returns the new argv */
static char **receive(int fd, int *argc_out) {
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    if (buf == NULL) _exit(126);
    for (;;) {
        if (len == cap && (buf = realloc(buf, cap *= 2)) == NULL) _exit(126);
        ssize_t r = read(fd, buf + len, cap - len);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) _exit(126);
        if (r == 0) break;
        len += (size_t)r;
    }
    close(fd);
    if (len == 0) _exit(0); /* the engine closed the pool */
    if (buf[len - 1] != '\0') _exit(126);
    size_t n = 0;
    for (size_t i = 0; i < len; i++) n += buf[i] == '\0';
    char **items = calloc(n + 2, sizeof *items);
    if (items == NULL) _exit(126);
    size_t k = 0;
    for (size_t i = 0; i < len; i += strlen(buf + i) + 1) items[k++] = buf + i;
    if (chdir(items[0]) != 0) fail(errno, "chdir failed", items[0]);
    size_t e = 1;
    while (e < k && items[e][0] != '\0') e++;
    if (e >= k) _exit(126);
    items[e] = NULL; /* terminates the environment */
    environ = items + 1;
    /* a separate array: a placeholder written over items[e] would un-terminate the environment
     * and hand the options and the tool's argv (`LD_PRELOAD=...`) to the tool as variables */
    char **args = calloc(k - e + 1, sizeof *args);
    if (args == NULL) _exit(126);
    args[0] = "sb_launch"; /* a placeholder for the program name */
    for (size_t i = e + 1; i < k; i++) args[i - e] = items[i];
    *argc_out = (int)(k - e);
    return args;
}

/* -W: a pidfd of this process (the tool once exec'd: same pid) on SOCK, with one byte; 1 when
 * sent. The engine keeps it until the tool has been reaped, then reads the wait status the
 * kernel kept for it. Sent after the isolation is applied: nothing else runs here before. */
#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
static int send_pidfd(int sock) {
    int pidfd = (int)syscall(SYS_pidfd_open, getpid(), 0);
    if (pidfd < 0) return 0;
    char byte = 'p';
    struct iovec iov = {&byte, 1};
    union { char buf[CMSG_SPACE(sizeof(int))]; struct cmsghdr align; } u;
    memset(&u, 0, sizeof u);
    struct msghdr msg;
    memset(&msg, 0, sizeof msg);
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = u.buf;
    msg.msg_controllen = sizeof u.buf;
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &pidfd, sizeof(int));
    ssize_t n;
    do n = sendmsg(sock, &msg, MSG_NOSIGNAL); while (n < 0 && errno == EINTR);
    close(pidfd);
    return n == 1;
}

/* -i: pid 1 of a pid namespace. The kernel delivers a signal to a namespace's init only when it
 * has a handler, so a tool that is pid 1 survives its own kill(getpid(), SIGKILL) and never
 * reaps what its children orphan; the tool runs as pid 2 instead, under the same Landlock domain
 * and seccomp filter (applied above, inherited across fork). -w: the same parent, which reports
 * how the tool ended on REPORT_FD (the status pipe; the tool never holds it). */
static void run_as_parent(char **cmd, int report_fd) {
    pid_t tool = fork();
    if (tool < 0) fail(errno, "fork failed", NULL);
    if (tool == 0) {
        if (report_fd >= 0 && !keep_status) close(report_fd);
        pe_execvp(cmd[0], cmd);
        fprintf(stderr, "policy-engine launcher: cannot execute `%s`: %s\n", cmd[0],
                strerror(errno));
        _exit(errno == ENOENT ? 127 : 126);
    }
    close(0); /* the tool's stdin alone: a tool closing it gives the engine's writes EPIPE */
    for (;;) {
        int st = 0;
        pid_t got = waitpid(-1, &st, 0);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) _exit(126); /* ECHILD before the tool was seen: cannot happen */
        if (got != tool) continue; /* an orphan reaped */
        if (report_fd >= 0) {
            char end[64];
            int n = snprintf(end, sizeof end, "{\"tool_end\": {\"%s\": %d}}",
                             WIFEXITED(st) ? "exit" : "signal",
                             WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
            write_all(report_fd, end, (size_t)n);
        }
        /* leaving kills the rest of the namespace, as bwrap's init does */
        _exit(WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
    }
}

int main(int argc, char **argv) {
    parse(argc, argv);
    for (int i = 0; i < ncg; i++) { /* "0" is the writer itself, in v1 and v2 alike */
        ssize_t w = write(cg_fds[i], "0", 1);
        if (w != 1) fail(errno, "cannot join the exec cgroup", NULL);
        close(cg_fds[i]);
    }
    ncg = 0;
    if (hold_fd >= 0) {
        int fd = hold_fd;
        hold_fd = -1;
        argv = receive(fd, &argc);
        parse(argc, argv);
        if (ncg != 0 || hold_fd >= 0) usage(); /* cgroups only at spawn; one hold */
    }
    if (optind >= argc) usage();
    /* bind sources first (as root: their parents may be closed to the sandbox uid), then the
     * drop; rlimits and the cgroup were applied above, while still privileged */
    if (new_ipc && unshare(CLONE_NEWIPC) != 0) fail(errno, "unshare(CLONE_NEWIPC) failed", NULL);
    if (nopens > 0 || nhides > 0) stage();
    if (run_uid > 0) {
        if (setgroups(0, NULL) != 0) fail(errno, "setgroups failed", NULL);
        if (setresgid((gid_t)run_gid, (gid_t)run_gid, (gid_t)run_gid) != 0)
            fail(errno, "setresgid failed", NULL);
        if (setresuid((uid_t)run_uid, (uid_t)run_uid, (uid_t)run_uid) != 0)
            fail(errno, "setresuid failed", NULL);
        if (getuid() == 0 || geteuid() == 0 || setuid(0) == 0) fail(EPERM, "still root", NULL);
    }
    if (status_fd >= 0) {
        const char *what = NULL, *path = NULL;
        put("{\"launcher\": \"native\", \"caps\": \"");
        if (caps) {
            if (drop_caps() != 0) fail(errno, "capset failed", NULL);
            put("dropped\"");
        } else {
            put("kept\"");
        }
        if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0)
            fail(errno, "PR_SET_NO_NEW_PRIVS failed", NULL);
        put(", \"landlock\": \"");
        if (want_ll) {
            int abi = 0, rc = landlock_apply(rules, nrules, deny_tcp, scope, &abi, &what, &path);
            if (rc < 0 && ll_required) fail(-rc, what, path);
            put_layer(rc, what, "enforced (abi ", abi, ")");
        } else {
            put("off");
        }
        put("\", \"seccomp\": \"");
        if (seccomp_hex != NULL) {
            int len = 0, rc = seccomp_apply(seccomp_hex, &len, &what);
            if (rc < 0 && sc_required) fail(-rc, what, NULL);
            put_layer(rc, what, "enforced (", len, " instructions)");
        } else {
            put("off");
        }
        put("\"}");
        write_all(status_fd, status, status_len);
        /* -W: the tool's end through its pidfd, no fork; -w's report when it cannot be sent */
        if (end_fd >= 0) /* an init (-i) stays the tool's parent: it reports as -w does */
            report_end = as_init || !send_pidfd(end_fd);
        /* -k: the next launcher appends its own status; -w: this one appends the tool's end */
        if (!keep_status && !report_end) close(status_fd);
    }
    if (end_fd >= 0) close(end_fd); /* never the tool's: it could send a pidfd of its choosing */
    if (as_init || report_end) /* never returns */
        run_as_parent(argv + optind, report_end ? status_fd : -1);
    pe_execvp(argv[optind], argv + optind);
    fprintf(stderr, "policy-engine launcher: cannot execute `%s`: %s\n", argv[optind],
            strerror(errno));
    return errno == ENOENT ? 127 : 126;
}
