# `make demo` and `make test` set everything up on a fresh machine: they create (or reuse) .venv,
# install the project with the tested versions pinned in constraints.txt, then run.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export OMP_NUM_THREADS ?= 1
export MUJOCO_GL ?= egl

.PHONY: demo test lint bench install clean sysdeps

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

# The diffusers-native backbone plugins install next to the core, each its own distribution.
PLUGINS := plugins/wan22 plugins/easyanimate

$(STAMP): $(PY) pyproject.toml constraints.txt $(addsuffix /pyproject.toml,$(PLUGINS))
	$(PY) -m pip install --quiet -c constraints.txt -e ".[data,dev,diffusers]" $(addprefix -e ,$(PLUGINS))
	@touch $(STAMP)

install: $(STAMP)

# Offscreen MuJoCo rendering (Meta-World data generation) needs EGL.
sysdeps:
	@ldconfig -p | grep -q libEGL.so.1 || (apt-get update -qq && \
		apt-get install -y -qq libegl1 libegl-mesa0 libgl1-mesa-dri libopengl0)

demo: sysdeps $(STAMP)
	$(VENV)/bin/workbench demo

test: sysdeps $(STAMP)
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -q

lint: $(STAMP)
	$(VENV)/bin/ruff check .

bench: $(STAMP)
	@for b in benchmarks/[!_]*.py; do echo "== $$b"; (cd benchmarks && ../$(PY) $$(basename $$b)) || exit 1; done

clean:
	rm -rf $(VENV) outputs
