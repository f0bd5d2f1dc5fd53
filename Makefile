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
	$(PY) -m pip install -q --no-compile -e '.[test]'
	$(PY) -m compileall -q -j 0 -x '/(tests?|testing)/' $$($(PY) -c "$$PACKAGE_DIRS") > /dev/null
	touch $(STAMP)

# pip byte-compiles every file it installs, one at a time (about 10 s here, most of it packages
# never imported: scipy, jaxlib's extras, huggingface_hub); instead `make` byte-compiles the
# packages that oi2jax, its CLI and the tests import, on every core (about 4 s). Byte-compiled
# ahead, since where PYTHONDONTWRITEBYTECODE is set each process would compile what it imports.
IMPORTED := jax jaxlib numpy ml_dtypes opt_einsum lark flatbuffers safetensors gguf tokenizers jinja2 \
	markupsafe yaml _pytest pytest pluggy iniconfig xdist execnet hypothesis sortedcontainers \
	_hypothesis_globals _hypothesis_pytestplugin py pyflakes vulture filelock pygments typing_extensions
export PACKAGE_DIRS := import glob, importlib.util as u, sysconfig; print(*[p for n in "$(IMPORTED)".split() \
	for s in [u.find_spec(n)] if s for p in (s.submodule_search_locations or [s.origin])], \
	*glob.glob(sysconfig.get_paths()["purelib"] + "/__editable__*.py"))

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
