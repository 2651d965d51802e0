# duoserve: one Makefile. CPU build always; CUDA objects too when nvcc is found (or CUDA=1).
#   make            build/duoserve (+ CUDA objects when nvcc is present)
#   make test       build and run every test (cmocka unit tests + end-to-end)
#   make debug      the same binary and tests with ASan + UBSan, in build-debug/
#   make setup      install the Debian packages (scripts/install-deps.sh)
#   make run        start the daemon on the built-in demo model (or MODEL=dir)

CC      ?= cc
BUILD   ?= build
NVCC    ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)

# C17, warnings as the house style asks; -O2 because the CPU reference runs real models in tests.
CFLAGS  ?= -O2 -g
# (CFLAGS/LDFLAGS are the user's to override; the project's own flags live in DUO_CFLAGS.)
DUO_CFLAGS := -std=c17 -Wall -Wextra -Wstrict-prototypes -Wno-unused-parameter -D_GNU_SOURCE -ffp-contract=off \
              -I. -MMD -MP -pthread
# Libraries from Debian packages (scripts/install-deps.sh).
LDLIBS  += -luv -lcjson -lpcre2-8 -lutf8proc -lm -pthread

# CUDA: auto when nvcc exists; CUDA=0 forces it off, CUDA=1 forces it on.
ifeq ($(CUDA),)
  CUDA := $(if $(NVCC),1,0)
endif
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
# Hopper (H100/H200): the kernels use sm_90a's wgmma and TMA, so 90a is the one architecture
# they build for (CUDA_ARCH is the Dockerfile's build argument).
CUDA_ARCH ?= 90a
NVCCFLAGS ?= -O3 -g -lineinfo -std=c++17 -gencode arch=compute_$(CUDA_ARCH),code=sm_$(CUDA_ARCH) \
             -Xcompiler -Wall,-Wextra,-Wno-unused-parameter -I.

ENGINE_SRC := $(sort $(wildcard engine/*.c engine/text/*.c))
SERVER_SRC := $(filter-out server/main.c,$(sort $(wildcard server/*.c)))
# cuda/*.c: the CUDA backend's plain C parts (no CUDA calls), built in every build so their tests run in CI
CUDA_C_SRC := $(sort $(wildcard cuda/*.c))
CUDA_SRC   := $(sort $(wildcard cuda/*.cu))
LIB_OBJ    := $(patsubst %.c,$(BUILD)/%.o,$(ENGINE_SRC) $(SERVER_SRC) $(CUDA_C_SRC))
CUDA_OBJ   := $(patsubst %.cu,$(BUILD)/%.o,$(CUDA_SRC))
TEST_SRC   := $(sort $(wildcard tests/test_*.c))
TEST_BIN   := $(patsubst tests/%.c,$(BUILD)/tests/%,$(TEST_SRC))

# The CUDA objects are always compiled when CUDA=1 (CI proves they build without a GPU); they
# are linked into duoserve, with --device cuda enabled, once the CUDA backend is present.
CUDA_BACKEND := $(wildcard cuda/backend_cuda.cu)
ifeq ($(CUDA),1)
  CUDA_ALL := $(CUDA_OBJ)
  ifneq ($(CUDA_BACKEND),)
    DUO_CFLAGS += -DDUO_CUDA=1
    LIB_OBJ += $(CUDA_OBJ)
    LDLIBS  += -L$(CUDA_HOME)/lib64 -lcublasLt -lcublas -lcudart -lstdc++ -ldl
    CUDA_TEST := $(BUILD)/duoserve-test-cuda $(BUILD)/duoserve-test-cuda-sampling
  endif
endif

# Objects are rebuilt when the flags change (CUDA=0 <-> CUDA=1 share the build folder).
FLAGS_STAMP := $(BUILD)/.flags
$(shell mkdir -p $(BUILD) && echo '$(CC) $(DUO_CFLAGS) $(CFLAGS) $(LDLIBS)' | cmp -s - $(FLAGS_STAMP) || \
        echo '$(CC) $(DUO_CFLAGS) $(CFLAGS) $(LDLIBS)' > $(FLAGS_STAMP))

.PHONY: all test debug setup run clean fuzz bench
all: $(BUILD)/duoserve $(CUDA_ALL) $(CUDA_TEST)

# `duoserve --version` names the commit; only main.o is rebuilt when it changes.
GIT_HASH := $(shell git describe --always --dirty --abbrev=10 2>/dev/null || echo unknown)
GIT_STAMP := $(BUILD)/.git_hash
$(shell echo '$(GIT_HASH)' | cmp -s - $(GIT_STAMP) || echo '$(GIT_HASH)' > $(GIT_STAMP))
$(BUILD)/server/main.o: DUO_CFLAGS += -DDUO_GIT_HASH='"$(GIT_HASH)"'
$(BUILD)/server/main.o: $(GIT_STAMP)

$(BUILD)/libduoserve.a: $(LIB_OBJ) $(FLAGS_STAMP)
	@mkdir -p $(@D)
	@rm -f $@
	ar rcs $@ $(filter %.o,$^)

$(BUILD)/duoserve: $(BUILD)/server/main.o $(BUILD)/libduoserve.a
	$(CC) $(DUO_CFLAGS) $(CFLAGS) -o $@ $^ $(LDFLAGS) $(LDLIBS)

$(BUILD)/%.o: %.c $(FLAGS_STAMP)
	@mkdir -p $(@D)
	$(CC) $(DUO_CFLAGS) $(CFLAGS) -c -o $@ $<

# ptxas's messages are shown and checked: wgmma serialized by ptxas (C7515/C7518/C7520: e.g. a wgmma
# issued on a branch inside its group) fails the build, since it silently costs a kernel its speed
$(BUILD)/cuda/%.o: cuda/%.cu
	@mkdir -p $(@D)
	$(NVCC) $(NVCCFLAGS) -MMD -MP -c -o $@ $< 2> $@.msg || { cat $@.msg >&2; exit 1; }
	@cat $@.msg >&2; if grep -q 'instructions are serialized' $@.msg; then \
	    echo "$<: ptxas serialized wgmma instructions (see above)" >&2; rm -f $@; exit 1; fi

$(BUILD)/tests/%: tests/%.c $(BUILD)/libduoserve.a
	@mkdir -p $(@D)
	$(CC) $(DUO_CFLAGS) $(CFLAGS) -o $@ $< $(BUILD)/libduoserve.a $(LDFLAGS) $(LDLIBS) -lcmocka

$(BUILD)/duoserve-test-cuda: tests/cuda/test_cuda_ops.c $(BUILD)/libduoserve.a
	$(CC) $(DUO_CFLAGS) $(CFLAGS) -o $@ $< $(BUILD)/libduoserve.a $(LDFLAGS) $(LDLIBS)
$(BUILD)/duoserve-test-cuda-sampling: tests/cuda/test_cuda_sampling.c $(BUILD)/libduoserve.a
	$(CC) $(DUO_CFLAGS) $(CFLAGS) -o $@ $< $(BUILD)/libduoserve.a $(LDFLAGS) $(LDLIBS)

# Every unit test binary, then the end-to-end scripts; stops at the first failure.
test: $(BUILD)/duoserve $(BUILD)/bench_gpu $(TEST_BIN) $(CUDA_ALL) $(CUDA_TEST)
	@BUILD=$(BUILD) ./tests/run_all.sh $(TEST_BIN)

# Benchmarks (not part of the tests): engine throughput on the CPU, tokenizer speed.
$(BUILD)/bench_%: scripts/bench_%.c $(BUILD)/libduoserve.a
	$(CC) $(DUO_CFLAGS) $(CFLAGS) -o $@ $< $(BUILD)/libduoserve.a $(LDFLAGS) $(LDLIBS)
$(BUILD)/check_%: scripts/check_%.c $(BUILD)/libduoserve.a
	$(CC) $(DUO_CFLAGS) $(CFLAGS) -o $@ $< $(BUILD)/libduoserve.a $(LDFLAGS) $(LDLIBS)

# ktrace: a CUPTI injection library that logs every kernel (graphs included), for GPU machines
# without Nsight Systems (scripts/ktrace.c, scripts/ktrace_report.py)
$(BUILD)/libktrace.so: scripts/ktrace.c
	@mkdir -p $(@D)
	$(CC) -std=c17 -O2 -shared -fPIC -I$(CUDA_HOME)/include -o $@ $< -L$(CUDA_HOME)/lib64 -lcupti -pthread

bench: $(BUILD)/bench_engine $(BUILD)/bench_tokenizer
	./$(BUILD)/bench_engine ../shared/models/stories260k 128 1 8 32

# libFuzzer harness for request parsing and validation (clang), e.g. make fuzz FUZZ_SECONDS=600
FUZZ_SECONDS ?= 60
$(BUILD)/fuzz_request: tests/fuzz_request.c server/openai.c server/openai_choice.c server/openai_error.c \
                       server/openai_fields.c server/openai_nul.c server/openai_request.c server/openai_response.c \
                       server/openai_tools.c server/tool_parser.c engine/text/utf8.c
	@mkdir -p $(@D)
	clang -std=c17 -g -O1 -D_GNU_SOURCE -I. -Wall -Wextra -fsanitize=fuzzer,address,undefined \
	      -fno-sanitize-recover=undefined -o $@ $^ -lcjson -lutf8proc -lm
fuzz: $(BUILD)/fuzz_request
	mkdir -p $(BUILD)/fuzz_corpus && cp -n tests/fuzz_corpus/* $(BUILD)/fuzz_corpus/
	./$(BUILD)/fuzz_request -max_total_time=$(FUZZ_SECONDS) -max_len=65536 -dict=tests/fuzz_request.dict \
	      -print_final_stats=1 $(BUILD)/fuzz_corpus

debug:
	$(MAKE) BUILD=build-debug CUDA=0 CFLAGS="-O1 -g -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer" \
	        LDFLAGS="-fsanitize=address,undefined" test

setup:
	./scripts/install-deps.sh
	$(MAKE)

MODEL ?=
run: $(BUILD)/duoserve
	./$(BUILD)/duoserve serve $(if $(MODEL),-m $(MODEL))

clean:
	rm -rf build build-debug

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
