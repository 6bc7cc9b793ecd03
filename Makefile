# Each target sets up the virtual environment itself on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# pytest processes for the tests that are not timing-based (each starts its own embedded broker); the
# integration tests mostly wait on the broker, so two share a 2-core machine well.
TEST_PROCESSES ?= 2

.PHONY: demo test bench schemas lint clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test,dev,embedded-broker,report]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/confidence-streams demo

test: $(STAMP)
	$(BIN)/ruff check streams tests bench examples
	$(BIN)/ruff format --check streams tests bench examples
	$(BIN)/mypy streams/scoring streams/producer.py examples
	$(BIN)/pytest -q -p no:cacheprovider -n $(TEST_PROCESSES) --dist worksteal -m "not serial"
	$(BIN)/pytest -q -p no:cacheprovider -m serial

bench: $(STAMP)
	$(BIN)/python -m bench

schemas: $(STAMP)
	$(BIN)/python -m streams.schemas

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check streams tests bench examples
	$(BIN)/mypy streams/scoring streams/producer.py examples

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
