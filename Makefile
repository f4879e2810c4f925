# Two commands do all set-up on a fresh machine:
#   make book   install into .venv, build the HTML book in _build/html
#   make test   install into .venv, run the unit tests and every notebook under nbval, each
#               notebook alone in a folder outside the repository, as a Colab reader runs it
# Others:
#   make lab        install JupyterLab into .venv and open the notebooks
#   make student    write the student edition (solutions stubbed out) into student/
#   make notebooks  re-execute every notebook in place (after you change one)
#   make bench      run the benchmark suite (CPU, and the GPU if there is one) into results/bench/
#   make gpu-data   copy Multi30k into .gpu_data/ for a GPU machine that sees only the repository
#   make gpu-run    the GPU call (tools/gpu_run.sh): at most nine minutes on one GPU, files in $OUT
#   make gpu-dry-run  the same call at tiny sizes on the CPU (seconds; make test runs it with one
#                     of its five benchmark parts)
#   make test-portable  the notebooks and the tests that compare with committed results, again
#                     with PyTorch held to its plain kernels: another arithmetic (CI runs it)
#   make clean      remove the built book and the reader's folder that make test made

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

# Deterministic notebook outputs: fixed hash seed; deterministic cuBLAS when a GPU is present.
export PYTHONHASHSEED := 0
export CUBLAS_WORKSPACE_CONFIG := :4096:8
export MPLBACKEND := module://matplotlib_inline.backend_inline

.PHONY: book test test-portable lab notebooks student clean install bench vendor gpu-data gpu-run gpu-dry-run

install: $(STAMP)

# Re-install only when the requirements change: a second `make` is quick. pip would
# byte-compile every file it installs, on one core (36 of the 55 s a fresh install took on 2
# cores); instead Python compiles each module the first time it is imported, and keeps it
# (a fresh install: 19 s). So the commands here write bytecode even where the environment
# says not to (PYTHONDONTWRITEBYTECODE, set on some CI machines): else every process would
# compile PyTorch again (1.6 s).
unexport PYTHONDONTWRITEBYTECODE
$(STAMP): requirements.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet --no-compile -r requirements.txt
	$(PY) -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (attnbook)" > /dev/null
	touch $(STAMP)

book: $(STAMP) vendor
	$(VENV)/bin/jupyter-book build . -W -n --keep-going

# MathJax and the translator page's onnxruntime-web are served with the book, so that math
# renders and the page translates offline: copies from npm in _build/vendor (quick when they are
# there; without npm, a MathJax loader that uses a CDN and a page that says its runtime is missing).
vendor: $(STAMP)
	$(PY) tools/fetch_mathjax.py
	$(PY) tools/fetch_ort.py

# One thread per process: the two pytest workers, their notebook kernels and the commands the
# tests start share two cores, and PyTorch's OpenMP threads spin-wait when the cores are
# oversubscribed (chapter 6 took 5 minutes instead of 10 s). The stored outputs were executed
# with one thread too. A command that a test runs with two threads (as its result was made)
# waits passively (OMP_WAIT_POLICY): spinning beside the other worker, the speedrun's tiny test
# took 101 s instead of 22. torch.compile's C++ compiler runs in one process too
# (TORCHINDUCTOR_COMPILE_THREADS): with a pool of compiler workers the compile test used 46 s
# of CPU on its own, without it 36 s (beside the other pytest worker it took 68 s with the pool
# in one run of make test, 54 and 61 s without it in two others). None of these settings
# changes a number.
DURATIONS ?= 15
TEST_ENV := OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE TORCHINDUCTOR_COMPILE_THREADS=1

# The notebooks run as a reader runs them who opened each one on its own (Colab, a download):
# tools/as_a_reader.py makes, outside the repository, an environment with PyTorch and Jupyter
# but not the book's package, installs the package there with the notebooks' own set-up cell
# (ATTNBOOK_REPOSITORY = this working tree), and copies each notebook alone into an empty
# folder; nbval runs them there in that environment's kernel. (make test-portable runs them in
# the repository, as a reader of a clone does.) The notebooks first: the longest items (chapter
# 9's training, the toy chapters) start early, and the many short tests fill both workers at the
# end, so neither waits long for the other.
READER := $(or $(TMPDIR),/tmp)/attnbook-reader-$(shell printf '%s' '$(CURDIR)' | cksum | cut -d' ' -f1)

test: $(STAMP) vendor
	$(PY) tools/as_a_reader.py $(READER)
	$(TEST_ENV) JUPYTER_PATH=$(READER)/jupyter $(PY) -m pytest -c pyproject.toml \
	    $(READER)/notebooks tests --nbval --nbval-kernel-name attnbook-reader -n 2 \
	    --dist loadscope --nbval-sanitize-with tests/nbval_sanitize.cfg --nbval-cell-timeout 900 \
	    -p no:cacheprovider -q -ra --durations=$(DURATIONS)

# The committed outputs and results were made with one machine's arithmetic (attnbook.utils.
# arithmetic: its processor, PyTorch's vector kernels, MKL's and oneDNN's). There their checks
# are exact; on a reader's laptop (AVX2, Apple silicon, Colab) they compare within tolerances
# (attnbook.reproduce). test-portable runs those checks with PyTorch, MKL and oneDNN held to
# their plain kernels, which no machine that made a committed file used: a check that holds
# only on one machine's last bits fails here, not on a reader's laptop. No browser test.
# torch.compile's kernels are cached by machine, not by these caps: the run keeps its own cache.
PORTABLE := ATEN_CPU_CAPABILITY=default MKL_ENABLE_INSTRUCTIONS=SSE4_2 ONEDNN_MAX_CPU_ISA=SSE41 \
	TORCHINDUCTOR_CACHE_DIR=$(CURDIR)/_build/torchinductor-portable
PORTABLE_TESTS := notebooks tests/test_toy_seeds.py tests/test_explorer.py tests/test_stored.py \
	tests/test_live.py tests/test_reproduce.py

test-portable: $(STAMP)
	$(PORTABLE) $(TEST_ENV) $(PY) -m pytest $(PORTABLE_TESTS) --nbval \
	    --nbval-current-env -n 2 --dist loadscope --nbval-sanitize-with tests/nbval_sanitize.cfg \
	    --nbval-cell-timeout 900 -p no:cacheprovider -q -ra --durations=5

lab: $(STAMP)
	$(PY) -m pip install --quiet jupyterlab
	$(VENV)/bin/jupyter lab notebooks/

notebooks: $(STAMP)
	OMP_NUM_THREADS=1 $(PY) tools/execute_notebooks.py notebooks/*.ipynb

# Several minutes on a laptop CPU; writes results/bench/cpu/ (and cuda/) JSON and PNG files,
# which the appendix "Performance" reads. BENCH_ARGS="--threads 1" on a busy machine.
bench: $(STAMP)
	$(PY) -m attnbook benchmarks $(BENCH_ARGS)

# The GPU call (README, "GPU notes"). gpu-run needs no install: a lent GPU machine has its own
# PyTorch and no package index, so the script runs the source with that machine's python3.
gpu-data: $(STAMP)
	$(PY) -m attnbook gpu_run --prepare-data

gpu-run:
	bash tools/gpu_run.sh

gpu-dry-run: $(STAMP)
	OUT=$${OUT:-gpu-call-out} PYTHON=$(PY) bash tools/gpu_run.sh --dry-run

student: $(STAMP)
	$(PY) -m attnbook homework student notebooks student

clean:
	rm -rf _build build $(READER)
