/* A background thread ("bg") makes N calls of fwrite(10 bytes) to FILE
 * and prints the mean cost of one call in ns: the interposition's cost on
 * a buffered write (Redis's snapshot child makes about ten per key). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <time.h>

static const char *path;
static long n;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static void *bg(void *arg) {
    (void)arg;
    prctl(PR_SET_NAME, "bg");
    FILE *f = fopen(path, "w");
    if (!f) {
        perror("fopen");
        exit(2);
    }
    static const char b[10] = "0123456789";
    double t0 = now();
    for (long i = 0; i < n; i++)
        fwrite(b, 1, sizeof b, f);
    double t = now() - t0;
    fclose(f);
    printf("ns/fwrite %.1f\n", t * 1e9 / n);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: fwrite FILE N\n");
        return 2;
    }
    path = argv[1];
    n = atol(argv[2]);
    pthread_t t;
    pthread_create(&t, NULL, bg, NULL);
    pthread_join(t, NULL);
    remove(path);
    return 0;
}
