/* attack 40: real syscalls inside the sandbox; prints "name=errno" (0: succeeded), one a line.
   Each probe runs in a forked child so a SIGSYS kill (i386 arch) is reported as "killed:N". */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <sys/sysmacros.h>
#include <unistd.h>

static const char *dir;
static char path[4096];

static long sc(long nr, long a, long b, long c, long d, long e, long f) {
    long r = syscall(nr, a, b, c, d, e, f);
    return r < 0 ? errno : 0;
}

static int probe(const char *name) {
    snprintf(path, sizeof path, "%s/p-%s", dir, name);
    unlink(path);
    if (!strcmp(name, "mount")) return sc(165, (long)"none", (long)dir, (long)"tmpfs", 0, 0, 0);
    if (!strcmp(name, "umount2")) return sc(166, (long)dir, 0, 0, 0, 0, 0);
    if (!strcmp(name, "unshare_user")) return sc(272, CLONE_NEWUSER, 0, 0, 0, 0, 0);
    if (!strcmp(name, "unshare_0")) return sc(272, 0, 0, 0, 0, 0, 0);
    if (!strcmp(name, "ptrace")) return sc(101, 0, 0, 0, 0, 0, 0);
    if (!strcmp(name, "bpf")) return sc(321, 0, 0, 0, 0, 0, 0);
    if (!strcmp(name, "io_uring_setup")) return sc(425, 1, 0, 0, 0, 0, 0);
    if (!strcmp(name, "open_tree")) return sc(428, AT_FDCWD, (long)dir, 0, 0, 0, 0);
    if (!strcmp(name, "fsopen")) return sc(430, (long)"tmpfs", 0, 0, 0, 0, 0);
    if (!strcmp(name, "setns")) return sc(308, 0, 0, 0, 0, 0, 0);
    if (!strcmp(name, "chroot")) return sc(161, (long)dir, 0, 0, 0, 0, 0);
    if (!strcmp(name, "keyctl")) return sc(250, 0, 0, 0, 0, 0, 0);
    if (!strcmp(name, "userfaultfd")) return sc(323, 0, 0, 0, 0, 0, 0);
    if (!strcmp(name, "mount_setattr")) return sc(442, -1, 0, 0, 0, 0, 0);
    if (!strcmp(name, "clone_newuser")) {
        long r = syscall(56, CLONE_NEWUSER | SIGCHLD, 0, 0, 0, 0);
        if (r == 0) _exit(0);
        if (r > 0) { waitpid(r, 0, 0); return 0; }
        return errno;
    }
    if (!strcmp(name, "clone_newns_hi")) {  /* namespace flag with the high word set too */
        long r = syscall(56, 0xFFFFFFFF00000000L | CLONE_NEWNS | SIGCHLD, 0, 0, 0, 0);
        if (r == 0) _exit(0);
        if (r > 0) { waitpid(r, 0, 0); return 0; }
        return errno;
    }
    if (!strcmp(name, "clone_plain")) {
        long r = syscall(56, SIGCHLD, 0, 0, 0, 0);
        if (r == 0) _exit(0);
        if (r > 0) { waitpid(r, 0, 0); return 0; }
        return errno;
    }
    if (!strcmp(name, "clone3")) return sc(435, 0, 0, 0, 0, 0, 0);
    if (!strcmp(name, "openat2")) return sc(437, AT_FDCWD, (long)dir, 0, 0, 0, 0);
    if (!strcmp(name, "openat_rdonly")) return sc(257, AT_FDCWD, (long)dir, O_RDONLY, 0, 0, 0);
    if (!strcmp(name, "openat_creat_0644")) return sc(257, AT_FDCWD, (long)path, O_CREAT | O_WRONLY, 0644, 0, 0);
    if (!strcmp(name, "openat_creat_suid")) return sc(257, AT_FDCWD, (long)path, O_CREAT | O_WRONLY, 04755, 0, 0);
    if (!strcmp(name, "open_creat_sgid")) return sc(2, (long)path, O_CREAT | O_WRONLY, 02755, 0, 0, 0);
    if (!strcmp(name, "creat_suid")) return sc(85, (long)path, 04755, 0, 0, 0, 0);
    if (!strcmp(name, "chmod_suid") || !strcmp(name, "chmod_0600") || !strcmp(name, "fchmodat_sgid")
        || !strcmp(name, "fchmodat2_suid") || !strcmp(name, "fchmod_suid")) {
        int fd = open(path, O_CREAT | O_WRONLY, 0644);
        if (fd < 0) return 1000 + errno;
        if (!strcmp(name, "chmod_suid")) return sc(90, (long)path, 04755, 0, 0, 0, 0);
        if (!strcmp(name, "chmod_0600")) return sc(90, (long)path, 0600, 0, 0, 0, 0);
        if (!strcmp(name, "fchmod_suid")) return sc(91, fd, 04755, 0, 0, 0, 0);
        if (!strcmp(name, "fchmodat_sgid")) return sc(268, AT_FDCWD, (long)path, 02755, 0, 0, 0);
        return sc(452, AT_FDCWD, (long)path, 04755, 0, 0, 0);
    }
    if (!strcmp(name, "mknod_chr")) return sc(133, (long)path, S_IFCHR | 0600, makedev(1, 3), 0, 0, 0);
    if (!strcmp(name, "mknodat_blk")) return sc(259, AT_FDCWD, (long)path, S_IFBLK | 0600, makedev(7, 0), 0, 0);
    if (!strcmp(name, "mknod_fifo")) return sc(133, (long)path, S_IFIFO | 0600, 0, 0, 0, 0);
    if (!strcmp(name, "socket_inet")) return sc(41, AF_INET, SOCK_STREAM, 0, 0, 0, 0);
    if (!strcmp(name, "socket_inet6")) return sc(41, AF_INET6, SOCK_DGRAM, 0, 0, 0, 0);
    if (!strcmp(name, "socket_unix")) return sc(41, AF_UNIX, SOCK_STREAM, 0, 0, 0, 0);
    if (!strcmp(name, "socket_netlink")) return sc(41, AF_NETLINK, SOCK_RAW, 0, 0, 0, 0);
    if (!strcmp(name, "socketpair_dgram")) { int sv[2]; return sc(53, AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0, (long)sv, 0, 0); }
    if (!strcmp(name, "socketpair_stream")) { int sv[2]; return sc(53, AF_UNIX, SOCK_STREAM, 0, (long)sv, 0, 0); }
    if (!strcmp(name, "bind")) {
        int sv[2];
        if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv)) return 1000 + errno;
        struct sockaddr_un_ { unsigned short f; char p[108]; } a = {AF_UNIX, "\0pe-attack40"};
        return sc(49, sv[0], (long)&a, 2 + 12, 0, 0, 0);
    }
    if (!strcmp(name, "fallocate_keep") || !strcmp(name, "fallocate_0") || !strcmp(name, "fallocate_zero")) {
        int fd = open(path, O_CREAT | O_RDWR, 0644);
        if (fd < 0) return 1000 + errno;
        long mode = !strcmp(name, "fallocate_keep") ? 1 : !strcmp(name, "fallocate_zero") ? 0x10 : 0;
        return sc(285, fd, mode, 0, 4096, 0, 0);
    }
    if (!strcmp(name, "setxattr") || !strcmp(name, "fsetxattr") || !strcmp(name, "lsetxattr")) {
        int fd = open(path, O_CREAT | O_RDWR, 0644);
        if (fd < 0) return 1000 + errno;
        if (!strcmp(name, "fsetxattr")) return sc(190, fd, (long)"user.x", (long)"v", 1, 0, 0);
        return sc(!strcmp(name, "setxattr") ? 188 : 189, (long)path, (long)"user.x", (long)"v", 1, 0, 0);
    }
    if (!strcmp(name, "setxattrat")) return sc(463, AT_FDCWD, (long)dir, 0, (long)"user.x", 0, 0);
    if (!strcmp(name, "personality_norandom")) return sc(135, 0x0040000, 0, 0, 0, 0, 0);
    if (!strcmp(name, "personality_query")) return sc(135, 0xFFFFFFFF, 0, 0, 0, 0, 0);
    if (!strcmp(name, "x32_getpid")) return sc(0x40000000 | 39, 0, 0, 0, 0, 0, 0);
    if (!strcmp(name, "nr_minus1")) return sc(-1, 0, 0, 0, 0, 0, 0);
    if (!strcmp(name, "nr_500_unknown")) return sc(500, 0, 0, 0, 0, 0, 0);
    if (!strcmp(name, "getpid")) return sc(39, 0, 0, 0, 0, 0, 0);
    if (!strcmp(name, "i386_getpid")) {  /* int 0x80: arch AUDIT_ARCH_I386 -> kill */
        long r; __asm__ volatile("int $0x80" : "=a"(r) : "a"(20L) : "memory");
        return r < 0 ? (int)-r : 0;
    }
    if (!strcmp(name, "i386_mount")) {
        long r; __asm__ volatile("int $0x80" : "=a"(r) : "a"(21L), "b"(0L), "c"(0L), "d"(0L) : "memory");
        return r < 0 ? (int)-r : 0;
    }
    return 9999;
}

int main(int argc, char **argv) {
    dir = argv[1];
    for (int i = 2; i < argc; i++) {
        fflush(stdout);
        pid_t p = fork();
        if (p == 0) { int e = probe(argv[i]); printf("%s=%d\n", argv[i], e); fflush(stdout); _exit(0); }
        int st = 0;
        waitpid(p, &st, 0);
        if (WIFSIGNALED(st)) printf("%s=killed:%d\n", argv[i], WTERMSIG(st));
    }
    return 0;
}
