/*
 * test_fault.h - whether a host access to an address faults: the tests of backends whose
 * memory the host must not read (cpu-strict, vulkan) touch a buffer in a forked child, whose
 * SIGSEGV handler ends it with a code that says whether the fault was at the buffer.
 */
#ifndef DSV4_TEST_FAULT_H
#define DSV4_TEST_FAULT_H

#include <stdbool.h>
#include <stddef.h>

enum { TEST_CHILD_READ = 43, TEST_CHILD_FAULT_HERE = 42, TEST_CHILD_FAULT_ELSEWHERE = 44 };

/* Forks a child that reads (or writes) p[0]; returns its exit code (TEST_CHILD_*: the read
 * went through, or it faulted inside [p, p + len) or elsewhere), or 128 + the signal that
 * ended it. */
int  test_touch_in_child(const void *p, size_t len, bool write);
/* A fault at the buffer: the handler's code, or SIGSEGV itself where a sanitizer's handler
 * stays in place (ASan reports the SEGV and exits 1). */
bool test_faulted(int code);

#endif /* DSV4_TEST_FAULT_H */
