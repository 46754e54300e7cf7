/* test_fault.c - see test_fault.h. */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test.h"
#include "test_fault.h"

static volatile const uint8_t *g_probe; /* the buffer the child touches */
static size_t                  g_probe_len;

static void on_segv(int sig, siginfo_t *si, void *uc)
{
    (void)sig, (void)uc;
    const uint8_t *a = si->si_addr;
    _exit(a >= g_probe && a < g_probe + g_probe_len ? TEST_CHILD_FAULT_HERE : TEST_CHILD_FAULT_ELSEWHERE);
}

int test_touch_in_child(const void *p, size_t len, bool write)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        struct sigaction sa;
        memset(&sa, 0, sizeof(sa));
        sa.sa_sigaction = on_segv;
        sa.sa_flags     = SA_SIGINFO;
        sigaction(SIGSEGV, &sa, NULL);
        g_probe     = p;
        g_probe_len = len;
        if (write) ((volatile uint8_t *)g_probe)[0] = 1;
        else (void)g_probe[0];
        _exit(TEST_CHILD_READ);
    }
    int st = 0;
    if (pid < 0 || waitpid(pid, &st, 0) != pid) return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

bool test_faulted(int code)
{
    return code == TEST_CHILD_FAULT_HERE || code == 128 + SIGSEGV || (TEST_SANITIZED && code == 1);
}
