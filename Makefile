# dsv4 - hand-written GNU Makefile. `make help` lists the targets.
#
# Variables: CC, CFLAGS (default -O2 -g), WERROR=1 (warnings are errors; CI sets it),
# SANITIZE=address,undefined | thread (separate build dir), DEBUG=1 (DSV4_DEBUG checks:
# allocation guard, arena poisoning, debug asserts), BUILD=dir (default build; any other
# build dir also holds its own dsv4 binary, so parallel builds do not collide),
# ARCH=x86_64|other (default: the first field of `$(CC) -dumpmachine`; read from the command
# line only, since kernel builds export ARCH=x86/arm64). The x86 kernel files
# (src/backend/cpu/x86_*.c) are built only when ARCH is x86_64, the NEON ones (arm_*.c) only
# when it is aarch64 (`make CC=aarch64-linux-gnu-gcc BUILD=build-aarch64`); any other value
# builds the portable C path alone (scalar is the best level), e.g.
# `make ARCH=generic BUILD=build-generic`
# on x86 (each in its own BUILD dir: objects do not record the flags they were built with).

comma    := ,
CC       ?= cc
CFLAGS   ?= -O2 -g
WERROR   ?= 0
SANITIZE ?=
DEBUG    ?= 0

WARN := -Wall -Wextra -Wshadow -Wstrict-prototypes -Wmissing-prototypes -Wformat=2 -Wundef \
        -Wpointer-arith -Wvla
ifeq ($(WERROR),1)
WARN += -Werror
endif

BUILD ?= build
ifneq ($(SANITIZE),)
override BUILD := $(BUILD)-san-$(subst $(comma),-,$(SANITIZE))
SANFLAGS := -fsanitize=$(SANITIZE) -fno-omit-frame-pointer -fno-sanitize-recover=all
endif
ifeq ($(DEBUG),1)
override BUILD := $(BUILD)-debug
DEFS += -DDSV4_DEBUG
endif

DEPS_PKGS := jansson oniguruma libmicrohttpd
ALL_CFLAGS  = -std=c11 $(CFLAGS) $(WARN) $(SANFLAGS) -pthread
ALL_CPPFLAGS = -Iinclude -Isrc -Itools -D_GNU_SOURCE $(DEFS) -MMD -MP
LDLIBS   := -ljansson -lonig -lmicrohttpd -lutf8proc -lm -lpthread
LDFLAGS  += $(SANFLAGS) -pthread

ifneq ($(origin ARCH),command line)
ARCH := $(firstword $(subst -, ,$(shell $(CC) -dumpmachine 2>/dev/null)))
endif
X86_SRC   := $(wildcard src/backend/cpu/x86_*.c)
ARM_SRC   := $(wildcard src/backend/cpu/arm_*.c)
LIB_SRC   := $(shell find src -name '*.c' | sort)
ifneq ($(ARCH),x86_64)
# Other targets: no x86 objects, and cpu.h declares no x86 tables (a reference is a compile
# error, not a link error). Also taken by an x86 compiler when ARCH=generic is asked for.
LIB_SRC   := $(filter-out $(X86_SRC),$(LIB_SRC))
DEFS      += -DDSV4_HAVE_X86=0
endif
ifneq ($(ARCH),aarch64)
# The same for the AArch64 kernels (arm_*.c): aarch64 only, not with ARCH=generic.
LIB_SRC   := $(filter-out $(ARM_SRC),$(LIB_SRC))
DEFS      += -DDSV4_HAVE_NEON=0
endif
# Vulkan (src/backend/vulkan/, docs/BACKENDS.md "The Vulkan backend"): VULKAN=1 builds it
# (libvulkan-dev and glslc: tools/install_deps.sh test), VULKAN=0 leaves it out. By default it
# is built when pkg-config knows vulkan, glslc is on PATH and the target is this machine (a
# cross or ARCH=generic build leaves it out). Without it the registry lists the CPU kinds only.
VULKAN ?= auto
ifeq ($(VULKAN),auto)
override VULKAN := $(shell [ "$(ARCH)" = "$$(uname -m)" ] && pkg-config --exists vulkan 2>/dev/null && \
                     command -v glslc >/dev/null 2>&1 && echo 1 || echo 0)
endif
VK_SRC    := $(shell find src/backend/vulkan -name '*.c' 2>/dev/null | sort)
ifeq ($(VULKAN),1)
DEFS      += -DDSV4_HAVE_VULKAN=1
LDLIBS    += $(shell pkg-config --libs vulkan 2>/dev/null || echo -lvulkan)
else
LIB_SRC   := $(filter-out $(VK_SRC),$(LIB_SRC))
DEFS      += -DDSV4_HAVE_VULKAN=0
endif
# MPI (src/dist/, docs/DISTRIBUTED.md): MPI=1 builds expert parallelism over MPI (Open MPI:
# libopenmpi-dev), MPI=0 leaves it out (`--ep N` then says so). By default it is built when
# pkg-config knows mpi-c and the target is this machine. Sanitizer builds leave it out: the
# MPI library's own allocations at load are not ours to report.
MPI ?= auto
ifeq ($(MPI),auto)
override MPI := $(shell [ "$(ARCH)" = "$$(uname -m)" ] && [ -z "$(SANITIZE)" ] && \
                  pkg-config --exists mpi-c 2>/dev/null && echo 1 || echo 0)
endif
ifeq ($(MPI),1)
DEFS      += -DDSV4_HAVE_MPI=1 $(shell pkg-config --cflags mpi-c)
LDLIBS    += $(shell pkg-config --libs mpi-c)
else
DEFS      += -DDSV4_HAVE_MPI=0
endif
TOOL_SRC  := $(filter-out tools/main.c,$(shell find tools -maxdepth 1 -name '*.c' | sort))
# tools/support/: what both the commands and the tests call (checkpoint generator, HTTP
# client), an archive of its own, so the test runner links no command object.
SUPPORT_SRC := $(shell find tools/support -name '*.c' | sort)
TEST_SRC  := $(shell find tests -name '*.c' -not -path 'tests/fuzz/*' -not -path '*/node_modules/*' | sort)

LIB_OBJ   := $(LIB_SRC:%.c=$(BUILD)/%.o)
TOOL_OBJ  := $(TOOL_SRC:%.c=$(BUILD)/%.o)
SUPPORT_OBJ := $(SUPPORT_SRC:%.c=$(BUILD)/%.o)
TEST_OBJ  := $(TEST_SRC:%.c=$(BUILD)/%.o)
LIB       := $(BUILD)/libdsv4.a
ifeq ($(VULKAN),1)
# The shaders: GLSL compiled to SPIR-V by glslc, embedded in the library as C arrays by
# tools/spv_embed.sh (od and sed: no other tool).
VK_SHADERS := $(sort $(wildcard src/backend/vulkan/shaders/*.comp))
VK_SPV     := $(VK_SHADERS:src/backend/vulkan/shaders/%.comp=$(BUILD)/vk/%.spv)
LIB_OBJ    += $(BUILD)/vk/vk_shaders.o
endif
SUPPORT   := $(BUILD)/libdsv4-support.a
# The chat page of `dsv4 serve` (src/server/webui/chat.html), embedded in the library as a
# C array by tools/file_embed.sh (od and sed) into a generated file under $(BUILD)/gen/.
WEBUI_HTML := src/server/webui/chat.html
LIB_OBJ    += $(BUILD)/gen/webui_chat.o

BIN := dsv4
ifneq ($(BUILD),build)
BIN := $(BUILD)/dsv4
endif

.PHONY: all help test test-san test-tsan valgrind fuzz golden demo clean bench bench-tokenizer bench-levers soak cross-check cross-aarch64
.DEFAULT_GOAL := all

all: $(BIN)

help:
	@echo "dsv4 - DeepSeek-V4 inference engine"
	@echo ""
	@echo "  make              build ./dsv4"
	@echo "  make test         install what the tests need, build, run every test (exit 1 on failure)"
	@echo "  make test-san     the tests under -fsanitize=address,undefined"
	@echo "  make test-tsan    the threaded groups (kernels, ops, pool, kv-disk store, scheduler, server, hardening) under -fsanitize=thread"
	@echo "  make valgrind     memcheck of the AVX2 and scalar paths on a tiny model"
	@echo "  make fuzz         build the libFuzzer harnesses (clang) into build-fuzz/"
	@echo "  make golden       regenerate tests/golden/ with the Python reference (needs torch)"
	@echo "  make demo         build and generate text from the bundled model"
	@echo "  make bench        the benchmarks (tokenizer: MB/s against tokenizers.js on the KJV)"
	@echo "  make bench-levers issue 40's lever microbenchmarks (x86: FP4 GEMV, exact integer block sums)"
	@echo "  make soak         soak benchmark: dsv4 serve under a mixed load for SOAK_MINUTES (15; not in CI)"
	@echo "  make cross-check  the portable path without the x86 kernels: ARCH=generic here, then an"
	@echo "                    aarch64 cross build (-Werror) and, with qemu-aarch64, dsv4 ops and kernels"
	@echo "  make cross-aarch64  the aarch64 build (NEON kernels) and, under qemu, the kernels, forward,"
	@echo "                    golden and batch-invariance tests (CI; tools/install_deps.sh cross first)"
	@echo "  make clean        remove build outputs"
	@echo ""
	@echo "  variables: WERROR=1  SANITIZE=address,undefined|thread  DEBUG=1  CC=...  BUILD=dir"
	@echo "             ARCH=x86_64|generic (default from \$$(CC) -dumpmachine, now $(ARCH); only x86_64"
	@echo "             builds the x86_*.c kernels, e.g. make CC=aarch64-linux-gnu-gcc BUILD=build-aarch64)"
	@echo "             VULKAN=1|0 (the Vulkan backend; default: built when pkg-config vulkan and glslc are here, now $(VULKAN))"
	@echo "             TEST_GROUPS=\"kernels forward\"  TEST_FLAGS=--strict  NO_INSTALL=1"

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CPPFLAGS) $(ALL_CFLAGS) -c $< -o $@

# Objects do not record their flags: registry.c, the one file that reads DSV4_HAVE_VULKAN, is
# rebuilt when the switch changes (a stamp per value, the other one removed).
$(BUILD)/src/backend/registry.o: $(BUILD)/vulkan-$(VULKAN).stamp
$(BUILD)/vulkan-$(VULKAN).stamp:
	@mkdir -p $(dir $@) && rm -f $(BUILD)/vulkan-*.stamp && touch $@

$(BUILD)/vk/%.spv: src/backend/vulkan/shaders/%.comp $(wildcard src/backend/vulkan/shaders/*.glsl)
	@mkdir -p $(dir $@)
	glslc --target-env=vulkan1.2 -O -o $@ $<

$(BUILD)/vk/vk_shaders.c: $(VK_SPV) tools/spv_embed.sh
	tools/spv_embed.sh $@ $(VK_SPV)

$(BUILD)/vk/vk_shaders.o: $(BUILD)/vk/vk_shaders.c
	$(CC) $(ALL_CPPFLAGS) $(ALL_CFLAGS) -c $< -o $@

# (a pattern: the fuzz build, build-fuzz/, makes its own)
%/gen/webui_chat.c: $(WEBUI_HTML) tools/file_embed.sh
	@mkdir -p $(dir $@)
	tools/file_embed.sh $@ srv_webui_chat_html $(WEBUI_HTML) server/server.h

$(BUILD)/gen/webui_chat.o: $(BUILD)/gen/webui_chat.c
	$(CC) $(ALL_CPPFLAGS) $(ALL_CFLAGS) -c $< -o $@

$(LIB): $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(SUPPORT): $(SUPPORT_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BIN): $(BUILD)/tools/main.o $(TOOL_OBJ) $(SUPPORT) $(LIB)
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

# The allocation guard's malloc hook goes into the test runner only (and into DSV4_DEBUG
# builds of the library): src/core/alloc_interpose.c compiled once more with the switch on.
$(BUILD)/tests/alloc_interpose.o: src/core/alloc_interpose.c
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CPPFLAGS) -DDSV4_ALLOC_INTERPOSE $(ALL_CFLAGS) -c $< -o $@

$(BUILD)/run_tests: $(TEST_OBJ) $(BUILD)/tests/alloc_interpose.o $(SUPPORT) $(LIB)
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/tests/%.o: ALL_CPPFLAGS += -Itests

$(BUILD)/tools/cmd_bench.o: DEFS += -DDSV4_GIT_REV=\"$(shell git describe --always --dirty 2>/dev/null || echo unknown)\"

# ISA files (x86_64 only, see ARCH): each compiled for its own instruction set, called only
# after a CPUID check.
ifeq ($(ARCH),x86_64)
$(BUILD)/src/backend/cpu/x86_avx2.o: ALL_CFLAGS += -O3 -mavx2 -mfma -mf16c
$(BUILD)/src/backend/cpu/x86_fp4_exact.o: ALL_CFLAGS += -O3 -mavx2 -mfma -mf16c
$(BUILD)/src/backend/cpu/x86_avx512.o $(BUILD)/src/backend/cpu/x86_fp4_exact512.o: ALL_CFLAGS += -O3 -mavx2 -mfma -mf16c -mavx512f -mavx512bw -mavx512vl -mavx512dq
$(BUILD)/src/backend/cpu/x86_avx512bf16.o $(BUILD)/src/backend/cpu/x86_avx512bf16_i16.o $(BUILD)/src/backend/cpu/x86_avx512bf16_attn.o: ALL_CFLAGS += -mavx2 -mfma -mf16c -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512bf16
$(BUILD)/src/backend/cpu/x86_amx_i16.o: ALL_CFLAGS += -mavx2 -mfma -mf16c -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512bf16 -mamx-tile -mamx-bf16
endif
ifeq ($(ARCH),aarch64)
$(BUILD)/src/backend/cpu/arm_neon.o: ALL_CFLAGS += -O3
endif

# `make test` sets itself up as `make demo` does: the Debian packages it needs (as root; else
# it names them), then the pinned npm packages of tests/tokenizer and tests/server whenever
# they are missing or stale against their package-lock.json. Tests whose dependency could not
# be installed are reported as skipped with the command that installs it.
# TEST_GROUPS="a b": run only these groups (default: all). TEST_FLAGS=--strict (CI): a test
# skipped for a missing dependency is a failure. NO_INSTALL=1: install nothing.
# Then STRICT_GROUPS run again on cpu-strict (run_tests --backend), the backend whose memory
# faults on any host access (docs/BACKENDS.md): by default the groups that
# run the model, only when TEST_GROUPS is not given; STRICT_GROUPS= skips the pass.
# And, in a build with the Vulkan backend, VULKAN_GROUPS run once more on it (lavapipe where the
# machine has no GPU; each test skips with the reason where no Vulkan device exists, and under
# the sanitizers, whose Mesa drivers deadlock): chunk and batch invariance, the no-allocation
# guards, the memory plan and the server against `dsv4 serve --backend vulkan`. A selection,
# not the groups whole: lavapipe runs a tiny-model decode step in ~0.1 s, and the whole of
# forward, spec, sched and server there takes ~15 min (docs/BACKENDS.md, "Tests": what the
# whole groups gave, and the server tests whose deadlines assume CPU speed).
# VULKAN_GROUPS= skips the pass; VULKAN_GROUPS="forward spec kv sched server" runs them whole.
TEST_FLAGS ?=
STRICT_GROUPS ?= $(if $(TEST_GROUPS),,forward spec kv session promptcache sched server)
VULKAN_TESTS  := forward/chunk_invariance_tiny_a forward/errors_change_nothing forward/no_alloc_while_decoding \
                 sched/batch_invariance sched/spec_identity sched/prefix_cache_hit sched/memory_from_backend \
                 sched/no_alloc_in_steps \
                 server/health_models_metrics server/chat_matches_engine server/completions server/speculative \
                 server/bad_inputs server/openai_client
VULKAN_GROUPS ?= $(if $(TEST_GROUPS)$(SANITIZE),,$(if $(filter 1,$(VULKAN)),$(VULKAN_TESTS)))
# With MPI the server tests run once more against `dsv4 serve` under mpirun on 2 ranks
# (run_tests --mpi 2; docs/DISTRIBUTED.md). MPI_GROUPS= skips the pass.
MPI_GROUPS ?= $(if $(TEST_GROUPS)$(SANITIZE),,$(if $(filter 1,$(MPI)),server))
test:
	@tools/install_deps.sh test
	@$(MAKE) --no-print-directory -j$$(nproc 2>/dev/null || echo 2) $(BIN) $(BUILD)/run_tests $(FUZZ_REPLAY)
	@tools/install_deps.sh npm $(BUILD)/run_tests
	DSV4_BIN=$(abspath $(BIN)) $(BUILD)/run_tests $(TEST_FLAGS) $(TEST_GROUPS)
ifneq ($(strip $(STRICT_GROUPS)),)
	DSV4_BIN=$(abspath $(BIN)) $(BUILD)/run_tests $(TEST_FLAGS) --backend cpu-strict $(STRICT_GROUPS)
endif
ifneq ($(strip $(VULKAN_GROUPS)),)
	DSV4_BIN=$(abspath $(BIN)) $(BUILD)/run_tests $(TEST_FLAGS) --backend vulkan $(VULKAN_GROUPS)
endif
ifneq ($(strip $(MPI_GROUPS)),)
	DSV4_BIN=$(abspath $(BIN)) $(BUILD)/run_tests $(TEST_FLAGS) --mpi 2 $(MPI_GROUPS)
endif

BENCH_SRC := $(shell find bench -name '*.c' 2>/dev/null | sort)

$(BUILD)/bench/%: $(BUILD)/bench/%.o $(LIB)
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

bench: bench-tokenizer

bench-tokenizer: $(BUILD)/bench/bench_tokenizer
	$(BUILD)/bench/bench_tokenizer

# Issue 40's lever microbenchmarks (bench/levers/README.md): x86 only, each kernel with its own
# __attribute__((target)) and a run-time CPU check, so no -m flags; built and run by hand, not
# part of `make test` or `make bench`. Exit 1 when a variant disagrees with the reference.
bench-levers: $(BUILD)/bench_fp4_int_dot
	timeout 300 $(BUILD)/bench_fp4_int_dot

$(BUILD)/bench_fp4_int_dot: bench/levers/fp4_int_dot.c
	@[ "$(ARCH)" = x86_64 ] || { echo "bench-levers: x86_64 only (ARCH=$(ARCH))"; exit 1; }
	@mkdir -p $(@D)
	$(CC) -std=c11 -O2 $(WARN) -Werror -pthread $< -o $@ -lm

# The portable C path built and run without the x86 kernels (tools/cross_build.sh; not in CI):
# ARCH=generic with $(CC), then CROSS_CC (aarch64-linux-gnu-gcc) and qemu-aarch64 if present.
CROSS_CC ?= aarch64-linux-gnu-gcc
cross-check:
	CROSS_CC=$(CROSS_CC) tools/cross_build.sh

# The aarch64 build with the NEON kernels, and under qemu (as a Cortex-A57) the tests that
# prove the numbers there: every kernel against the reference, chunk invariance, the golden
# fixtures at the neon level, batch invariance (CI; tools/install_deps.sh cross installs what
# it needs). The golden tests by name: the cross build has no Vulkan backend, and its golden
# test would be a skip that --strict counts as missing. They run light there (DSV4_TEST_LIGHT,
# tools/cross_build.sh): golden and v41_fwd at the neon level and one chunking of the exact
# path, as under the sanitizers; `make test` runs every level and chunking.
AARCH64_TESTS ?= kernels forward golden/exact_path_vs_reference golden/every_level_vs_reference \
                 golden/align_dump_and_perturbed_weight golden/align_on_strict sched/batch_invariance v41_fwd
cross-aarch64:
	CROSS_CC=$(CROSS_CC) QEMU_TESTS="$(AARCH64_TESTS)" tools/cross_build.sh --aarch64

# Soak benchmark, not part of `make test` or CI (bench/soak.sh): starts dsv4 serve on
# SOAK_MODEL, runs `dsv4 loadtest --soak` against it for SOAK_MINUTES (a mixed load; a
# report line every SOAK_REPORT_S seconds with RSS, KV pool and latencies), stops it with
# SIGTERM. Exit 1 when RSS grew after warm-up, a request was lost, P99 ITL drifted or the
# server did not exit 0. SOAK_SERVE_ARGS, SOAK_ARGS: more options for serve / loadtest.
SOAK_MINUTES    ?= 15
SOAK_MODEL      ?= models/kjv-v4-tiny
SOAK_REPORT_S   ?= 180
SOAK_SERVE_ARGS ?=
SOAK_ARGS       ?=
soak: $(BIN)
	SOAK_SERVE_ARGS="$(SOAK_SERVE_ARGS)" SOAK_ARGS="$(SOAK_ARGS)" \
	  bench/soak.sh ./$(BIN) $(SOAK_MODEL) $(SOAK_MINUTES) $(SOAK_REPORT_S)

test-san:
	$(MAKE) SANITIZE=address,undefined test

# The groups that run threads of their own (thread pool, scheduler) under ThreadSanitizer.
test-tsan:
	$(MAKE) SANITIZE=thread TEST_GROUPS="kernels ops kv kvdisk sched server hardening" test

# memcheck on the AVX2 and scalar code paths (valgrind cannot run AVX-512): a tiny model,
# prefill in chunks, decode, MTP.
VG_TOKENS := 1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24
VG_LEVELS := $(if $(filter x86_64,$(ARCH)),avx2 scalar,scalar)
valgrind: $(BIN)
	@mkdir -p $(BUILD)/vg && ./$(BIN) gen --preset tiny-a -q -o $(BUILD)/vg/tiny-a
	for lvl in $(VG_LEVELS); do \
	  DSV4_CPU=$$lvl valgrind -q --error-exitcode=9 --leak-check=full ./$(BIN) logits -m $(BUILD)/vg/tiny-a \
	    --tokens $(VG_TOKENS) --chunk 7 --mtp-out $(BUILD)/vg/mtp.bin --out $(BUILD)/vg/logits.bin || exit 1; \
	done
# cpu-strict (memory the host cannot access): the same logits, bit for bit
	DSV4_CPU=$(firstword $(VG_LEVELS)) valgrind -q --error-exitcode=9 --leak-check=full ./$(BIN) logits -m $(BUILD)/vg/tiny-a --backend cpu-strict \
	  --tokens $(VG_TOKENS) --chunk 7 --mtp-out $(BUILD)/vg/mtp-strict.bin --out $(BUILD)/vg/logits-strict.bin
	DSV4_CPU=$(firstword $(VG_LEVELS)) ./$(BIN) logits -m $(BUILD)/vg/tiny-a --tokens $(VG_TOKENS) --chunk 7 \
	  --mtp-out $(BUILD)/vg/mtp.bin --out $(BUILD)/vg/logits.bin
	cmp $(BUILD)/vg/logits.bin $(BUILD)/vg/logits-strict.bin && cmp $(BUILD)/vg/mtp.bin $(BUILD)/vg/mtp-strict.bin
	@echo "valgrind: no errors"

# Golden fixtures: `dsv4 gen` checkpoints in a temporary directory, run through the Python
# reference (tools/ref, Debian's python3 with torch); a few minutes on 2 cores.
PYTHON_REF ?= /usr/bin/python3
golden: $(BIN)
	$(PYTHON_REF) tools/ref/golden.py --dsv4 $(abspath $(BIN)) --out tests/golden

# The README's first command: on a fresh Debian 12 machine it installs the build dependencies
# (as root, with apt-get; otherwise it names them), builds dsv4 and streams text from the
# bundled demo model (models/kjv-v4-tiny, trained on the KJV by tools/train/).
DEMO_MODEL ?= models/kjv-v4-tiny
PROMPT     ?= And God said
DEMO_ARGS  ?= -n 160 --temp 0.6 --top-p 0.9 --seed 2
demo:
	@tools/install_deps.sh build
	@echo "building $(BIN) ..." >&2
	@$(MAKE) --no-print-directory -j$$(nproc 2>/dev/null || echo 2) $(BIN) >/dev/null
	@printf '%s' "$(PROMPT)"
	@./$(BIN) run -m $(DEMO_MODEL) --bos -p "$(PROMPT)" $(DEMO_ARGS)

# libFuzzer harnesses (clang): build-fuzz/fuzz_<name> from tests/fuzz/fuzz_<name>.c; each
# file's header says how to run it on its corpus, tests/fuzz/corpus/<name>. The library is
# built with coverage into an archive, so a harness links only the objects it calls (not the
# CPU backend); fuzz_server links tests/fuzz/stub_worker.c in place of src/server/worker.c.
# UBSan does not recover (as in test-san), so undefined behaviour is a crash libFuzzer keeps.
FUZZ_CC    ?= clang
FUZZ_NAMES := $(patsubst tests/fuzz/fuzz_%.c,%,$(wildcard tests/fuzz/fuzz_*.c))
FUZZ_SRC   := $(filter-out src/backend/cpu/% src/backend/vulkan/% src/server/worker.c,$(LIB_SRC))
FUZZ_FLAGS := -std=c11 -g -O1 -fno-omit-frame-pointer -Iinclude -Isrc -D_GNU_SOURCE -MMD -MP
fuzz: $(FUZZ_NAMES:%=build-fuzz/fuzz_%)
build-fuzz/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_FLAGS) -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=all -c $< -o $@
build-fuzz/obj/gen/webui_chat.o: build-fuzz/gen/webui_chat.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_FLAGS) -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=all -c $< -o $@
build-fuzz/libdsv4-fuzz.a: $(FUZZ_SRC:%.c=build-fuzz/obj/%.o) build-fuzz/obj/gen/webui_chat.o
	@rm -f $@
	ar rcs $@ $^
build-fuzz/fuzz_server: build-fuzz/obj/tests/fuzz/stub_worker.o
build-fuzz/fuzz_%: build-fuzz/obj/tests/fuzz/fuzz_%.o build-fuzz/libdsv4-fuzz.a
	$(FUZZ_CC) -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -o $@ $(filter %.o,$^) build-fuzz/libdsv4-fuzz.a $(LDLIBS)
-include $(shell find build-fuzz/obj -name '*.d' 2>/dev/null)

# The same harnesses without libFuzzer, for `make test` with any CC (and under test-san):
# each linked with tests/fuzz/replay_main.c into $(BUILD)/fuzz-replay/fuzz_<name>, which the
# fuzz test group runs over its corpus. The stub worker's objects come first, so the
# archive's worker.o is never pulled in.
FUZZ_REPLAY := $(FUZZ_NAMES:%=$(BUILD)/fuzz-replay/fuzz_%)
$(BUILD)/fuzz-replay/fuzz_server: $(BUILD)/tests/fuzz/stub_worker.o
$(BUILD)/fuzz-replay/fuzz_%: $(BUILD)/tests/fuzz/fuzz_%.o $(BUILD)/tests/fuzz/replay_main.o $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -o $@ $(filter %.o,$^) $(LIB) $(LDLIBS)
# kept (make would delete them as intermediates and relink every time)
.SECONDARY: $(FUZZ_NAMES:%=$(BUILD)/tests/fuzz/fuzz_%.o) $(BUILD)/tests/fuzz/replay_main.o \
            $(FUZZ_NAMES:%=build-fuzz/obj/tests/fuzz/fuzz_%.o)

clean:
	rm -rf build build-* dsv4

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
