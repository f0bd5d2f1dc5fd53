# Two entry points: `make demo` and `make test`. Both create .venv when it is missing.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.oi2jax-installed

.PHONY: demo test test-nightly clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) examples/demo.py

# two processes (pytest-xdist), a test file in one of them: its compiled programs stay shared
test: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist loadfile tests

# the long variants too (random differential in driver mode, 100-run stress): for a nightly run
test-nightly: $(STAMP)
	OI2JAX_PROFILE=nightly $(PY) -m pytest -q -n 2 --dist loadfile tests

clean:
	rm -rf $(VENV) build *.egg-info
