/* A background thread takes a mutex (or, with a third argument `rwlock`,
 * a read-write lock for writing) and, holding it, writes MIB MiB to a
 * file (paced by critio run); the main thread (foreground) then waits for
 * the lock (for reading, if a read-write lock) and prints how long it
 * waited, in seconds. With `rdheld`, the background thread holds the
 * read-write lock for reading and the main thread waits to write.
 *
 * With `cond`, nothing is held: the background thread signals a condition
 * variable once (ready), writes MIB MiB, and signals it again (done); the
 * main thread waits on the variable for done and prints how long.
 *
 * With `chain`, a second background thread ("bg-mid") takes a mutex m1
 * and then waits for the writer's mutex; the main thread waits for m1: it
 * waits for the writer only through bg-mid.
 *
 * With `fork-chain`, the chain crosses a process: a child process starts
 * the writer and its main thread waits for the writer's mutex; the main
 * thread waits for the child (waitpid), so for the writer only through
 * the child's main thread. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static pthread_mutex_t m = PTHREAD_MUTEX_INITIALIZER;
static pthread_rwlock_t rw = PTHREAD_RWLOCK_INITIALIZER;
static int use_rw, use_rdheld, use_cond, use_chain;
static pthread_mutex_t m1 = PTHREAD_MUTEX_INITIALIZER;
static volatile int mid_held;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int ready, done;
static volatile int held;
static const char *path;
static int mib;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static void *writer(void *arg) {
    static char buf[65536];
    (void)arg;
    prctl(PR_SET_NAME, "bg-writer");
    memset(buf, 'x', sizeof buf);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0 || write(fd, buf, 4096) != 4096) { /* classified before the lock */
        perror("writer");
        exit(2);
    }
    if (use_cond) {
        pthread_mutex_lock(&m);
        ready = 1;
        pthread_cond_signal(&cv);
        pthread_mutex_unlock(&m);
    } else if (use_rdheld)
        pthread_rwlock_rdlock(&rw);
    else if (use_rw)
        pthread_rwlock_wrlock(&rw);
    else
        pthread_mutex_lock(&m);
    held = 1;
    for (int i = 0; i < mib * 16; i++) {
        if (write(fd, buf, sizeof buf) != (ssize_t)sizeof buf) {
            perror("write");
            exit(2);
        }
    }
    if (use_cond) {
        pthread_mutex_lock(&m);
        done = 1;
        pthread_cond_signal(&cv);
        pthread_mutex_unlock(&m);
    } else if (use_rw || use_rdheld)
        pthread_rwlock_unlock(&rw);
    else
        pthread_mutex_unlock(&m);
    close(fd);
    return NULL;
}

static void *mid(void *arg) {
    (void)arg;
    prctl(PR_SET_NAME, "bg-mid");
    char p[4096];
    snprintf(p, sizeof p, "%s.mid", path);
    int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0 || write(fd, "x", 1) != 1) { /* classified: background */
        perror("mid");
        exit(2);
    }
    close(fd);
    unlink(p);
    while (!held)
        usleep(1000);
    pthread_mutex_lock(&m1);
    mid_held = 1;
    pthread_mutex_lock(&m); /* blocks: the writer holds it */
    pthread_mutex_unlock(&m);
    pthread_mutex_unlock(&m1);
    return NULL;
}

/* fork-chain: returns in the parent only. */
static void fork_chain(void) {
    pid_t child = fork();
    if (child < 0) {
        perror("fork");
        exit(2);
    }
    if (child == 0) {
        pthread_t t;
        pthread_create(&t, NULL, writer, NULL);
        while (!held)
            usleep(1000);
        pthread_mutex_lock(&m); /* blocks: the writer holds it */
        pthread_mutex_unlock(&m);
        pthread_join(t, NULL);
        _exit(0);
    }
    usleep(300000); /* the child's main thread is blocked on the mutex by now */
    double t0 = now();
    int status;
    waitpid(child, &status, 0);
    double waited = now() - t0;
    unlink(path);
    printf("waited %.3f\n", waited);
    exit(WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 2);
}

int main(int argc, char **argv) {
    if (argc != 3 && !(argc == 4 && (strcmp(argv[3], "rwlock") == 0 || strcmp(argv[3], "cond") == 0 ||
                                     strcmp(argv[3], "chain") == 0 || strcmp(argv[3], "fork-chain") == 0 ||
                                     strcmp(argv[3], "rdheld") == 0))) {
        fprintf(stderr, "usage: lock FILE MIB [rwlock|rdheld|cond|chain|fork-chain]\n");
        return 2;
    }
    path = argv[1];
    mib = atoi(argv[2]);
    if (argc == 4 && strcmp(argv[3], "fork-chain") == 0)
        fork_chain();
    use_rw = argc == 4 && strcmp(argv[3], "rwlock") == 0;
    use_rdheld = argc == 4 && strcmp(argv[3], "rdheld") == 0;
    use_cond = argc == 4 && strcmp(argv[3], "cond") == 0;
    use_chain = argc == 4 && strcmp(argv[3], "chain") == 0;
    pthread_t t;
    pthread_create(&t, NULL, writer, NULL);
    while (!held)
        usleep(1000);
    if (use_chain) {
        pthread_t t2;
        pthread_create(&t2, NULL, mid, NULL);
        while (!mid_held)
            usleep(1000);
        usleep(200000); /* bg-mid is blocked on the writer's mutex by now */
        double t0 = now();
        pthread_mutex_lock(&m1);
        double waited = now() - t0;
        pthread_mutex_unlock(&m1);
        pthread_join(t2, NULL);
        pthread_join(t, NULL);
        unlink(path);
        printf("waited %.3f\n", waited);
        return 0;
    }
    usleep(50000);
    double t0 = now();
    if (use_cond) {
        pthread_mutex_lock(&m);
        while (!done)
            pthread_cond_wait(&cv, &m);
        pthread_mutex_unlock(&m);
        double waited = now() - t0;
        pthread_join(t, NULL);
        unlink(path);
        printf("waited %.3f\n", waited);
        return 0;
    }
    if (use_rdheld)
        pthread_rwlock_wrlock(&rw);
    else if (use_rw)
        pthread_rwlock_rdlock(&rw);
    else
        pthread_mutex_lock(&m);
    double waited = now() - t0;
    if (use_rw || use_rdheld)
        pthread_rwlock_unlock(&rw);
    else
        pthread_mutex_unlock(&m);
    pthread_join(t, NULL);
    unlink(path);
    printf("waited %.3f\n", waited);
    return 0;
}
