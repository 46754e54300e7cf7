/* groups.h - every test group, in run order. One line per group: X(name). Each group's
 * file defines `const struct test_case test_group_<name>[]`, ending with {NULL, NULL}. */
X(numfmt)
X(safetensors)
X(checkpoint)
X(tok)
X(kernels)
X(forward)
X(kv)
X(sched)
X(chat)
X(golden)
X(server)
X(demo)
