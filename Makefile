# Two entry points: `make demo` and `make test`. Both create .venv when it is missing.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.oi2jax-installed

.PHONY: demo test test-nightly clean

# the venv's own pip when it installs pyproject projects editable (pip >= 21.3: Python 3.11's and
# later's bundled pip): upgraded only where older, not on every fresh clone (network, seconds)
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -c "import pip, sys; sys.exit(tuple(int(p) for p in pip.__version__.split('.')[:2]) < (21, 3))" \
		|| $(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) examples/demo.py

# byte-compiled once (where PYTHONDONTWRITEBYTECODE is set, every process the tests start would
# compile oi2jax's modules again: about 0.3 s each)
BYTECODE := $(PY) -m compileall -q -j 0 oi2jax tests examples benchmarks > /dev/null

# two processes (pytest-xdist), a test file in one of them: its compiled programs stay shared
test: $(STAMP)
	$(BYTECODE)
	$(PY) -m pytest -q -n 2 --dist loadfile tests

# the long variants too (random differential in driver mode, 100-run stress): for a nightly run
test-nightly: $(STAMP)
	$(BYTECODE)
	OI2JAX_PROFILE=nightly $(PY) -m pytest -q -n 2 --dist loadfile tests

clean:
	rm -rf $(VENV) build *.egg-info
