/*
 * The pod sandbox: the process that holds a pod's namespaces open while its containers come and go.
 *
 * It does nothing but wait. As PID 1 of a pod that shares its process namespace it also reaps orphans, so
 * they do not linger as zombies. SIGINT and SIGTERM end it cleanly; anything else is ignored.
 *
 * Built statically (see build.sh), so the image needs no loader and no libraries.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int sig) {
    (void)sig;
    _exit(0);
}

static void reap(int sig) {
    (void)sig;
    int saved = errno;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
    errno = saved;
}

int main(int argc, char **argv) {
    if (argc > 1 && (strcmp(argv[1], "-v") == 0 || strcmp(argv[1], "--version") == 0)) {
        puts("weightstream-pause 3.10");
        return 0;
    }
    if (getpid() != 1) {
        fputs("warning: pause is meant to run as PID 1 of a pod sandbox\n", stderr);
    }
    struct sigaction on_stop = {0};
    on_stop.sa_handler = stop;
    if (sigaction(SIGINT, &on_stop, NULL) < 0 || sigaction(SIGTERM, &on_stop, NULL) < 0) {
        perror("sigaction");
        return 1;
    }
    struct sigaction on_child = {0};
    on_child.sa_handler = reap;
    on_child.sa_flags = SA_NOCLDSTOP;
    if (sigaction(SIGCHLD, &on_child, NULL) < 0) {
        perror("sigaction");
        return 2;
    }
    for (;;) {
        pause();
    }
    return 3;
}
