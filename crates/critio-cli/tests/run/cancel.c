/* A foreground thread ("fg-waiter") waits on a condition variable that a
 * background thread ("bg-signal") signalled once, so it boosts that thread;
 * the main thread then cancels the waiter (pthread_cond_wait is a
 * cancellation point) and prints the signaller's kernel I/O priority
 * during the wait and after the cancelled waiter exited, as raw values. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

static pthread_mutex_t m = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static volatile int ready, stop, signaller;
static const char *path;

static void touch(const char *suffix) { /* an interposed file write: classified */
    char p[4096];
    snprintf(p, sizeof p, "%s.%s", path, suffix);
    int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0 || write(fd, "x", 1) != 1) {
        perror(p);
        exit(2);
    }
    close(fd);
    unlink(p);
}

static void *signal_once(void *arg) {
    (void)arg;
    prctl(PR_SET_NAME, "bg-signal");
    signaller = (int)syscall(SYS_gettid);
    touch("bg");
    pthread_mutex_lock(&m);
    ready = 1;
    pthread_cond_signal(&cv);
    pthread_mutex_unlock(&m);
    while (!stop)
        usleep(1000);
    return NULL;
}

static void *wait_forever(void *arg) {
    (void)arg;
    prctl(PR_SET_NAME, "fg-waiter");
    touch("fg");
    pthread_mutex_lock(&m);
    for (;;)
        pthread_cond_wait(&cv, &m); /* cancelled here */
    return NULL;
}

static long prio(int tid) { return syscall(SYS_ioprio_get, 1, tid); }

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: cancel FILE\n");
        return 2;
    }
    path = argv[1];
    pthread_t s, w;
    pthread_create(&s, NULL, signal_once, NULL);
    while (!ready)
        usleep(1000);
    pthread_create(&w, NULL, wait_forever, NULL);
    usleep(200000);
    long during = prio(signaller);
    pthread_cancel(w);
    pthread_join(w, NULL);
    pthread_mutex_unlock(&m); /* the cancelled waiter held it again */
    usleep(100000);
    long after = prio(signaller);
    stop = 1;
    pthread_join(s, NULL);
    printf("during %ld after %ld\n", during, after);
    return 0;
}
