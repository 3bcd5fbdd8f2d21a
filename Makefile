# flowsearch: one command to set up and run the demo, one to set up and run the tests.
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
# The CPU build of PyTorch, installed before anything else so pip never resolves a CUDA build.
TORCH  ?= torch==2.13.0
INDEX  ?= demo_index
QUERY  ?= how do octopuses hide from predators

.PHONY: setup demo test test-slow test-ray lint bench clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet "$(TORCH)"
	$(BIN)/pip install --quiet -e ".[dev,bench]"
	touch $@

demo: setup
	HF_HUB_OFFLINE=1 $(BIN)/flowsearch index data/sample.parquet --index $(INDEX) --overwrite
	HF_HUB_OFFLINE=1 $(BIN)/flowsearch query "$(QUERY)" --index $(INDEX) -k 5

test: setup
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q

# Model-quality tests on ../shared/data (set FLOWSEARCH_DATA elsewhere).
test-slow: setup
	HF_HUB_OFFLINE=1 FLOWSEARCH_DATA=$${FLOWSEARCH_DATA:-../shared/data} $(BIN)/python -m pytest -q -m slow

# The Ray engine against the local one on a local Ray (num_cpus=2): slow, run by CI after `test`.
test-ray: setup
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q -m slow tests/test_ray_ingest.py tests/test_ray_serve.py

lint: setup
	$(BIN)/ruff check flowsearch tests benchmarks data
	$(BIN)/ruff format --check flowsearch tests benchmarks data
	$(BIN)/mypy flowsearch

# Every suite benchmark's smallest configuration, in turn (python -m benchmarks list names them).
bench: setup
	HF_HUB_OFFLINE=1 $(BIN)/python -m benchmarks run --suite --smoke

clean:
	rm -rf $(VENV) $(INDEX) .pytest_cache .ruff_cache
