# Thin wrapper over CMake; the README's commands are `make run`, `make install` and `make test`.
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
BUILD ?= build
FUZZ_SECONDS ?= 10
ARGS ?=
PREFIX ?= /usr/local
DESTDIR ?=
# What `make run` and `make install` need; the test programs are built by `make build`.
PROGRAMS = diverge diverge-agent-runner

# New build trees are Ninja's (scripts/deps.sh installs it; a tree that exists keeps its
# generator): the Makefile generator's own processes cost a third of a build's CPU here.
export CMAKE_GENERATOR ?= Ninja

.PHONY: all deps test-deps lint configure build programs run install test test-unit test-asan test-tsan test-fuzz bench clean

all: build

deps:
	@bash scripts/deps.sh

# The tests' third-party peers (pinned npm packages, chromium, the macaroon libraries):
# installed once per machine into ~/.cache/diverge-test (DIVERGE_TEST_CACHE) and reused by
# every stage and every later run; a no-op when the cache is complete.
test-deps: deps
	@python3 tests/integration/npm_pin.py

lint: deps
	@bash scripts/lint.sh

build: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DWERROR=ON >/dev/null
	@bash scripts/build.sh $(BUILD) $(JOBS)

# A build dir that exists keeps its configuration (cmake --build regenerates it when the
# CMake files change); a new one gets the hardened RelWithDebInfo build.
configure: deps
	@test -f $(BUILD)/CMakeCache.txt || \
		cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DWERROR=ON >/dev/null

programs: configure
	@bash scripts/build.sh $(BUILD) $(JOBS) $(PROGRAMS)

run: programs
	./$(BUILD)/diverge serve $(ARGS)

# $(DESTDIR)$(PREFIX)/bin/diverge and diverge-agent-runner (the server starts the runner
# from its own directory).
install: programs
	@DESTDIR="$(DESTDIR)" cmake --install $(BUILD) --prefix "$(PREFIX)"

# The test stages are scripts/test.sh's (docs/testing.md says what runs where). The normal
# stage runs TEST_JOBS tests at once (default the CPUs + 1), the sanitizer stages
# SANITIZE_TEST_JOBS (default the CPUs + 2: docs/testing.md): ASan+UBSan the tests
# labelled `sanitize` or `asan` (ASAN_TESTS, default `-L sanitize|asan`),
# TSan the tests labelled `sanitize` or `tsan` (TSAN_TESTS, default `-L sanitize|tsan`).
# SANITIZE_TESTS, when given, sets both (SANITIZE_TESTS= runs every test there too).
TEST_JOBS ?= $(shell echo $$(($(JOBS) + 1)))
SANITIZE_TEST_JOBS ?= $(shell echo $$(($(JOBS) + 2)))
ASAN_TESTS ?= -L sanitize|asan
TSAN_TESTS ?= -L sanitize|tsan
TEST_ENV = JOBS=$(JOBS) TEST_JOBS=$(TEST_JOBS) SANITIZE_TEST_JOBS=$(SANITIZE_TEST_JOBS) \
	BUILD=$(BUILD) FUZZ_SECONDS=$(FUZZ_SECONDS) ASAN_TESTS='$(ASAN_TESTS)' \
	TSAN_TESTS='$(TSAN_TESTS)' \
	$(if $(filter undefined,$(origin SANITIZE_TESTS)),,SANITIZE_TESTS='$(SANITIZE_TESTS)')

test-unit: deps test-deps
	@$(TEST_ENV) bash scripts/test.sh normal

# AddressSanitizer + UndefinedBehaviorSanitizer.
test-asan: deps test-deps
	@$(TEST_ENV) bash scripts/test.sh asan

# ThreadSanitizer (the server's threads run under it in the integration tests);
# halt_on_error makes the first race fail its test.
test-tsan: deps test-deps
	@$(TEST_ENV) bash scripts/test.sh tsan

test-fuzz: deps
	@$(TEST_ENV) bash scripts/test.sh fuzz

# lint, the peers, then every stage in order, stopping at the first failure; the sanitizer
# and fuzz trees are built in the background at nice 19 while the earlier stages' tests run.
test: lint test-deps
	@$(TEST_ENV) bash scripts/test.sh all

bench: build
	bash bench/run.sh $(BUILD)
	bash bench/meter.sh $(BUILD)
	bash bench/webhook.sh $(BUILD)

clean:
	rm -rf build build-asan build-tsan build-fuzz
