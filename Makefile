# `make demo` and `make test` set everything up on a fresh machine: they create (or reuse) .venv,
# install the project with the tested versions pinned in constraints.txt, then run.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export OMP_NUM_THREADS ?= 1
export MUJOCO_GL ?= egl
# Material for MkDocs prints a banner about MkDocs 2.0 on every build unless this is set.
export NO_MKDOCS_2_WARNING ?= 1
# pip installs without compiling every module of every package to bytecode (torch alone has thousands; that
# took 40 of the full install's 95 s), and Python writes the bytecode of what is imported on first import
# instead, once, for every later process: the suite starts hundreds of interpreters (notebook kernels,
# torchrun ranks, the CLI), and an environment that sets PYTHONDONTWRITEBYTECODE would recompile the same
# modules in each of them.
unexport PYTHONDONTWRITEBYTECODE
# The four editable projects (the core and three plugins) build with the environment's own setuptools, pinned
# in constraints.txt and installed first, instead of a fresh isolated build environment each: resolving the
# full install took 21 s with isolation and 12 s without.
PIP_INSTALL = $(PY) -m pip install --quiet --no-compile --no-build-isolation -c constraints.txt
BUILD_TOOLS = $(PY) -m pip install --quiet -c constraints.txt setuptools

.PHONY: demo test check lint bench bench-real install clean sysdeps browser lab notebooks docs

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

# The diffusers-native backbone plugins install next to the core, each its own distribution.
PLUGINS := plugins/wan22 plugins/easyanimate plugins/dynamicrafter

$(STAMP): $(PY) pyproject.toml constraints.txt $(addsuffix /pyproject.toml,$(PLUGINS))
	$(BUILD_TOOLS)
	$(PIP_INSTALL) -e ".[data,widgets,dev,peft,diffusers,logging,docs]" $(addprefix -e ,$(PLUGINS))
	@touch $(STAMP)

install: $(STAMP)

# Offscreen MuJoCo rendering (Meta-World data generation) needs EGL.
sysdeps:
	@ldconfig -p | grep -q libEGL.so.1 || (apt-get update -qq && \
		apt-get install -y -qq libegl1 libegl-mesa0 libgl1-mesa-dri libopengl0)

# The browser test drives Debian's chromium (no browser download); install it when absent.
browser:
	@command -v chromium >/dev/null || ! command -v apt-get >/dev/null || [ "$$(id -u)" != 0 ] || \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null)

# The JupyterLab browser test drives JupyterLab itself (the lab extra).
LAB_STAMP := $(VENV)/.lab-installed
$(LAB_STAMP): $(STAMP)
	$(PIP_INSTALL) -e ".[lab]"
	@touch $(LAB_STAMP)

# `make demo` installs only what the demo imports: the core and, pinned alike, the packages of the data and widgets
# extras it reads (workbench/worldmodel/cli.py's `demo` command and WORLD_NEEDS in workbench/worldmodel/demo.py:
# Meta-World's scripted experts act in the closed-loop ranking, whose simulated outcomes are a shipped record;
# tests/test_cli_behaviour.py checks the list). No notebooks, diffusers or plugins: a fresh clone runs it sooner. A full install (`make install`, `make
# test`) serves it as it is. It trains and evaluates on two processes of one thread each (`--processes 2`).
DEMO_STAMP := $(VENV)/.demo-installed
DEMO_PACKAGES := h5py imageio imageio-ffmpeg pillow matplotlib metaworld mujoco packaging
$(DEMO_STAMP): $(PY) pyproject.toml constraints.txt
	$(BUILD_TOOLS)
	$(PIP_INSTALL) -e . $(DEMO_PACKAGES)
	@touch $(DEMO_STAMP)

demo: $(if $(wildcard $(STAMP)),$(STAMP),$(DEMO_STAMP))
	$(VENV)/bin/workbench demo

# Notebooks run under strict nbval: every stored output is compared after the sanitiser.
NBVAL := --nbval --nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg
# The suite runs file by file on three workers: a file's tests (a notebook's cells) run on one worker in
# order, and the browser tests never overlap (tests/conftest.py). Three on two cores, because a worker often
# waits (on a browser, a server, a kernel or a process starting) and the other two then keep both cores
# busy: 557 s of pytest against 584 s with two, back to back on the 2-core machine with the AVX2 kernels (about
# 5 s of that from a faster statistic, rank_agreement, that landed in between).
WORKERS ?= 3
# A test that hangs ends its worker after TEST_TIMEOUT seconds, with every thread's stack printed (pytest's
# faulthandler); a worker that crashes ends the run at once, naming its test (pytest-xdist 3.8 can wait for
# ever on a replaced worker under --dist loadfile). The whole run stops after RUN_TIMEOUT seconds (SIGINT,
# as Ctrl-C: pytest still prints its summary).
TEST_TIMEOUT ?= 600
RUN_TIMEOUT ?= 2700
XDIST := -n $(WORKERS) --dist loadfile --max-worker-restart=0 -o faulthandler_timeout=$(TEST_TIMEOUT) \
	-o faulthandler_exit_on_timeout=true

# Every test's CPU seconds go into the JUnit report; tests/cpu_budget.py then prints them per file beside the
# checked-in budget (the files with the largest budgets start first) and fails only on a big overshoot.
JUNIT ?= outputs/junit.xml

test: sysdeps browser $(STAMP) $(LAB_STAMP)
	$(VENV)/bin/ruff check .
	@mkdir -p $(dir $(JUNIT))
	timeout --foreground -s INT -k 60 $(RUN_TIMEOUT) $(PY) -m pytest -q $(XDIST) --durations=15 --junitxml=$(JUNIT) tests notebooks \
		$(NBVAL); \
		status=$$?; $(PY) tests/cpu_budget.py $(JUNIT) || status=1; exit $$status

# The inner loop: ruff and the cheapest test files of the budget table, about 2 minutes on 2 cores
# (CHECK_CPU: the CPU seconds of tests to take, cheapest first). `make test` stays the whole suite.
CHECK_CPU ?= 200
check: $(STAMP)
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -q $(XDIST) $$($(PY) tests/cpu_budget.py --fast $(CHECK_CPU))

# The documentation site (mkdocs.yml) into site/: guides, concepts, the API reference from the docstrings and
# the notebooks with their stored outputs. `make test` builds it with --strict (tests/test_docs_site.py).
docs: $(STAMP)
	$(VENV)/bin/mkdocs build
	@echo "make docs: open site/index.html"

lint: $(STAMP)
	$(VENV)/bin/ruff check .

# Re-execute the numbered notebooks and store their outputs (then `make test` compares against them).
notebooks: $(STAMP)
	$(PY) tools/execute_notebooks.py

# JupyterLab on the notebooks (as root it needs --allow-root; the news toast is switched off). Widget state is
# saved with the notebook, so a notebook saved here reopens without a kernel showing each view's last picture.
LAB_SETTINGS := $(VENV)/share/jupyter/lab/settings
lab: $(STAMP)
	$(PIP_INSTALL) -e ".[lab]"
	@mkdir -p $(LAB_SETTINGS)
	@echo '{"@jupyterlab/apputils-extension:notification": {"fetchNews": "false", "checkForUpdates": false}, \
		"@jupyter-widgets/jupyterlab-manager:plugin": {"saveState": true}}' > $(LAB_SETTINGS)/overrides.json
	$(VENV)/bin/jupyter lab notebooks --ContentsManager.pre_save_hook=workbench.widgets.static.keep_static_on_save \
		$$([ "$$(id -u)" = 0 ] && echo --allow-root)

# Every benchmark runs to the end and prints its ratios; the exit status is non-zero at the end if any
# missed a target or failed (each is listed). BENCH_FLAGS=--quick runs them all in seconds (no ratio judged).
bench: $(STAMP)
	@failed=""; for b in benchmarks/[!_]*.py; do [ "$$b" = benchmarks/real_size.py ] && continue; echo "== $$b"; \
		(cd benchmarks && ../$(PY) $$(basename $$b) $(BENCH_FLAGS)) || failed="$$failed $$(basename $$b)"; done; \
	if [ -n "$$failed" ]; then echo "make bench: short of a target or failed:$$failed"; exit 1; fi; \
	echo "make bench: every benchmark ran to the end$(if $(findstring --quick,$(BENCH_FLAGS)), (quick mode: no target judged), and met its targets)"

# The instruments at real size (each plugin's real architecture in bf16 with random weights, one process per
# model, 8-14 minutes each on 2 CPU cores, up to 16 GiB of memory): not part of `make bench`.
# BENCH_REAL_FLAGS=--quick runs the same code on the tiny configurations; --models picks some.
bench-real: $(STAMP)
	cd benchmarks && ../$(PY) real_size.py $(BENCH_REAL_FLAGS)

clean:
	rm -rf $(VENV) outputs site
