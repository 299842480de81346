# Thin wrapper over CMake; the README's commands are `make run`, `make install` and `make test`.
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
BUILD ?= build
FUZZ_SECONDS ?= 10
ARGS ?=
PREFIX ?= /usr/local
DESTDIR ?=
# What `make run` and `make install` need; the test programs are built by `make build`.
PROGRAMS = diverge diverge-agent-runner

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

test-unit: build test-deps
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

test-asan: deps test-deps
	@cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DWERROR=ON -DSANITIZE=address,undefined >/dev/null
	@bash scripts/build.sh build-asan $(JOBS)
	cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
		UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 ctest --output-on-failure -j $(JOBS)

# ThreadSanitizer over every test (unit and integration: the server's threads run under it);
# halt_on_error makes the first race fail its test.
test-tsan: deps test-deps
	@cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=Debug -DWERROR=ON -DSANITIZE=thread >/dev/null
	@bash scripts/build.sh build-tsan $(JOBS)
	cd build-tsan && TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
		ctest --output-on-failure -j $(JOBS)

test-fuzz: deps
	@CC=clang cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=Debug -DWERROR=ON -DFUZZ=ON >/dev/null
	@bash scripts/build.sh build-fuzz $(JOBS)
	@bash scripts/run_fuzz.sh build-fuzz $(FUZZ_SECONDS)

test: lint test-deps test-unit test-asan test-tsan test-fuzz

bench: build
	bash bench/run.sh $(BUILD)
	bash bench/meter.sh $(BUILD)
	bash bench/webhook.sh $(BUILD)

clean:
	rm -rf build build-asan build-tsan build-fuzz
