"""Exercises every call critio-preload interposes, in the ways a program
may use them, and prints one line per check. Run under `critio run` and
bare: the output must be the same (the library changes nothing a program
can see). Exit status 0 when every check behaved as POSIX says.
"""
import ctypes
import errno
import os
import sys
import tempfile
import threading

failures = []


def check(name, ok):
    print(f"{name}: {'ok' if ok else 'FAILED'}")
    if not ok:
        failures.append(name)


def expect_errno(name, fn, code):
    try:
        fn()
    except OSError as e:
        check(name, e.errno == code)
        return
    check(name, False)


d = tempfile.mkdtemp(prefix="critio-interpose-")
path = os.path.join(d, "f")

# Data written through every path reads back.
fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
check("write returns its count", os.write(fd, b"a" * 5000) == 5000)
check("pwrite returns its count", os.pwrite(fd, b"b" * 100, 10) == 100)
check("writev returns its count", os.writev(fd, [b"c" * 7, b"d" * 9]) == 16)
os.fsync(fd)
os.fdatasync(fd)
check("read reads back", os.pread(fd, 12, 8) == b"aabbbbbbbbbb")
os.lseek(fd, 0, os.SEEK_SET)
check("read returns the file", len(os.read(fd, 10000)) == 5016)
with open(path, "ab") as f:  # stdio: fwrite, fclose
    f.write(b"e" * (3 << 20))
check("buffered appends land", os.path.getsize(path) == 5016 + (3 << 20))

# errno is the real call's, on files the library times and on others.
ro = os.open(path, os.O_RDONLY)
expect_errno("write to a read-only file: EBADF", lambda: os.write(ro, b"x"), errno.EBADF)
expect_errno("pwrite at a negative offset: EINVAL", lambda: os.pwrite(fd, b"x", -1), errno.EINVAL)
expect_errno("write to a closed descriptor: EBADF", lambda: os.write(9999, b"x"), errno.EBADF)
r, w = os.pipe()
expect_errno("fsync of a pipe: EINVAL", lambda: os.fsync(r), errno.EINVAL)
check("pipe write and read", os.write(w, b"hi") == 2 and os.read(r, 2) == b"hi")
os.close(r)
os.close(w)
os.close(ro)

# Threads write concurrently; every byte lands.
def writer(i):
    # Name the OS thread (Python does not), as `thread=` rules see it.
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(15, f"writer{i}".encode(), 0, 0, 0)  # PR_SET_NAME
    tfd = os.open(os.path.join(d, f"t{i}"), os.O_WRONLY | os.O_CREAT, 0o600)
    for _ in range(64):
        os.write(tfd, b"t" * 65536)
    os.fsync(tfd)
    os.close(tfd)


ts = [threading.Thread(target=writer, args=(i,), name=f"writer{i}") for i in range(4)]
for t in ts:
    t.start()
for t in ts:
    t.join()
check("threads' writes land", all(os.path.getsize(os.path.join(d, f"t{i}")) == 64 * 65536 for i in range(4)))

# A forked child writes and exits; the parent sees its data and status.
pid = os.fork()
if pid == 0:
    cfd = os.open(os.path.join(d, "child"), os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(cfd, b"k" * (2 << 20))
    os.fdatasync(cfd)
    os._exit(7)
_, status = os.waitpid(pid, 0)
check("a forked child's status", os.WEXITSTATUS(status) == 7)
check("a forked child's data", os.path.getsize(os.path.join(d, "child")) == 2 << 20)

os.close(fd)
for name in os.listdir(d):
    os.unlink(os.path.join(d, name))
os.rmdir(d)
sys.exit(1 if failures else 0)
