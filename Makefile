# smart_replay: `make demo` runs the demo, `make test` runs every check.
# Both create .venv and install the pinned dependencies when needed.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: test pytest test-fast bazel-check bazel-test demo demo-train experiment benchmark soak install ops clean

install: $(STAMP)

$(STAMP): setup.py constraints.txt
	@$(PYTHON) -c 'import sys; v = sys.version_info[:2]; sys.exit(0 if (3, 9) <= v <= (3, 11) else "smart_replay needs CPython 3.9-3.11 (Reverb 0.14 has no wheels past 3.11); found %d.%d at $(PYTHON). Set PYTHON=/path/to/python3.11." % v)'
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip wheel setuptools
	$(PY) -m pip install --quiet -c constraints.txt -e '.[test,bench,plots,rlds,atari]'
	touch $(STAMP)

# The compiled TensorFlow op (smart_replay/ops: zstd inside the graph, for
# pixel buffers) is built by the first process that needs it, into a per-user
# cache (~/.cache/smart_replay), from zstd's source fetched with pip: only a
# C++ compiler is needed. `make ops` builds it now. Bazel builds its own copy
# for the tests.
ops: $(STAMP)
	$(PY) -m smart_replay.ops.build

# Every test: through Bazel when it is on PATH (each test file a py_test,
# offline; see tools/ and third_party/), else with pytest directly.
test: $(STAMP)
	@if command -v bazel >/dev/null 2>&1; then \
	  $(MAKE) --no-print-directory bazel-test; \
	else echo "bazel not on PATH: running pytest directly (apt-get install bazel-bootstrap for the Bazel checks)"; \
	  $(MAKE) --no-print-directory ops && $(PY) -m pytest tests; fi

pytest: $(STAMP) ops
	$(PY) -m pytest tests

# The fast unit tests of the pure parts (planner, limiter math, config diff,
# manifest, checkpoint choice): no Reverb server, under a minute.
test-fast: $(STAMP)
	$(PY) -m pytest -q -m unit tests

# BUILD files match the imports (tools/bazel/build_deps.py), then every
# py_test runs; a failing test fails the target.
bazel-check: $(STAMP)
	$(PY) tools/bazel/build_deps.py --check
	bazel build //...

bazel-test: $(STAMP) bazel-check
	bazel test //...

# Populate a starter buffer on the embedded thermal environment (4 simulated
# days), then load it in a fresh process, sample and summarize.
DEMO_ARGS := --buffer_name=demo --output_dir=demo_output --num_runs=4 --steps_per_run=288

demo: $(STAMP)
	$(VENV)/bin/smart-replay-populate $(DEMO_ARGS) --overwrite --quiet
	$(VENV)/bin/smart-replay-demo --buffer_dir=demo_output/demo_seq2_1152steps

# Train DQN on CartPole from a random-policy starter buffer, then show the
# greedy return (about a minute on 2 cores).
demo-train: $(STAMP)
	$(VENV)/bin/smart-replay-populate --buffer_name=cartpole --env=gymnasium:CartPole-v1 \
	  --policy=random --steps_per_run=500 --num_runs=4 --output_dir=demo_output --overwrite --quiet
	$(VENV)/bin/smart-replay-train --starter_dir=demo_output/cartpole_seq2_2000steps \
	  --run_dir=demo_output/dqn_run --gin_file=configs/train_dqn_cartpole.gin --overwrite

# Does a starter buffer help? No starter, copied, fixed and annealed mixes,
# 3 seeds each, on CartPole (DQN) and the thermal building (SAC): learning
# curves and tables in experiments/<setup>/ (about 30 minutes on 2 cores; run
# again to continue after an interruption). EXPERIMENT_ARGS=--seeds=0
experiment: $(STAMP)
	$(VENV)/bin/smart-replay-experiment --setup=cartpole --output_dir=experiments $(EXPERIMENT_ARGS)
	$(VENV)/bin/smart-replay-experiment --setup=thermal --output_dir=experiments $(EXPERIMENT_ARGS)

# Side-by-side speed, checkpoint and memory figures against the stock TF-Agents
# path (1,000,000 steps, about 10 minutes on 2 cores). BENCHMARK_ARGS=--steps=100000
benchmark: $(STAMP)
	$(PY) scripts/benchmark.py --output_dir=benchmark_results $(BENCHMARK_ARGS)

# Memory soak: one buffer written, sampled and checkpointed in this process;
# fails if RSS grows faster than 5 MB/min over 2 minutes after a 60 s warm-up
# (about 3.5 minutes in all). MALLOC_ARENA_MAX=2 caps what glibc keeps of
# the memory checkpoints free (see README). SOAK_ARGS='--duration_s=480'
soak: $(STAMP)
	MALLOC_ARENA_MAX=2 $(PY) scripts/soak.py --duration_s=120 $(SOAK_ARGS)

clean:
	rm -rf $(VENV) build dist *.egg-info demo_output benchmark_results experiments
	-bazel clean 2>/dev/null
