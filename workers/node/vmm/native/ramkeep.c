/*
 * ramkeep: an LD_PRELOAD shim for QEMU that keeps a shared RAM file whole.
 *
 * Why: a VM whose RAM is a private (copy-on-write) mapping of a capture that other VMs map
 * too (a fork child, a sandbox over its template's RAM) must never change that file. Yet
 * QEMU discards guest RAM the balloon's free page reporting hands back with
 * ram_block_discard_range(), which for any file-backed RAM block punches a hole in the
 * *file* (fallocate PUNCH_HOLE) before it drops the mapping (madvise DONTNEED) — even for
 * a MAP_PRIVATE mapping (QEMU 7.2; later versions only warn). Measured here: a fork child
 * freeing 200 MiB punched 196 MiB out of its parent's capture, which every sibling and the
 * parent's own resume read from.
 *
 * With this shim, QEMU's hole punch on the file named by RAMKEEP_FILE (compared by device
 * and inode, so any path to it counts) succeeds without touching the file; QEMU then drops
 * its private copies of those pages (MADV_DONTNEED), which is the memory given back: the
 * pages read as the capture's again, as they would in Firecracker's balloon. Every other
 * fallocate, and every other file (the qcow2 layers' discards), goes to libc unchanged.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <linux/falloc.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/types.h>

static int kept = -1; /* -1: not looked up yet, 0: nothing to keep, 1: keep (dev, ino) */
static dev_t kept_dev;
static ino_t kept_ino;

static void look_up(void)
{
    const char *path = getenv("RAMKEEP_FILE");
    struct stat st;

    kept = 0;
    if (path != NULL && path[0] != '\0' && stat(path, &st) == 0) {
        kept_dev = st.st_dev;
        kept_ino = st.st_ino;
        kept = 1;
    }
}

static int is_kept(int fd, int mode)
{
    struct stat st;

    if (!(mode & FALLOC_FL_PUNCH_HOLE)) {
        return 0;
    }
    if (kept < 0) {
        look_up();
    }
    return kept == 1 && fstat(fd, &st) == 0 && st.st_dev == kept_dev && st.st_ino == kept_ino;
}

int fallocate(int fd, int mode, off_t offset, off_t len)
{
    static int (*real)(int, int, off_t, off_t);

    if (is_kept(fd, mode)) {
        return 0;
    }
    if (real == NULL) {
        real = (int (*)(int, int, off_t, off_t))dlsym(RTLD_NEXT, "fallocate");
    }
    return real(fd, mode, offset, len);
}

int fallocate64(int fd, int mode, off_t offset, off_t len)
{
    static int (*real)(int, int, off_t, off_t);

    if (is_kept(fd, mode)) {
        return 0;
    }
    if (real == NULL) {
        real = (int (*)(int, int, off_t, off_t))dlsym(RTLD_NEXT, "fallocate64");
    }
    return real(fd, mode, offset, len);
}
