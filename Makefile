# qtts: the two commands are `make test` and `make book`; both set up .venv on a fresh machine.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.qtts-installed
# The numbered chapters in reading order, then the appendices and the results page (book/_toc.yml has the parts).
CHAPTERS := $(sort $(wildcard notebooks/[0-9][0-9]_*.py)) $(sort $(wildcard notebooks/appendix_*.py)) \
	$(wildcard notebooks/results.py)
# The chapters that port a checkpoint (split, goldens, export, KV cache, generation, voices, every kind, the batch,
# the two pitfall appendices and the 1.7B one) run again on each of VARIANTS after the default pass: a 1.7B talker
# wider than its code predictor, with instructions, and a VoiceDesign checkpoint.
PER_CHECKPOINT := 02 03 04 05 06 07 08 09 17 appendix_a appendix_b appendix_e
VARIANT_CHAPTERS := $(filter $(foreach n,$(PER_CHECKPOINT),notebooks/$(n)_%),$(CHAPTERS))
VARIANTS := tiny-1.7b-customvoice tiny-voicedesign
NBVAL := $(BIN)/python -m pytest --nbval-lax --nbval-cell-timeout=1800 -q
# Figures vanish from executed notebooks under MPLBACKEND=Agg.
unexport MPLBACKEND
export PYTHONHASHSEED := 0
# Bitwise-repeatable reference runs: MKL chooses kernels by memory alignment unless told not to (qtts_lib.reference).
export MKL_CBWR := AUTO,STRICT

.PHONY: setup test unit lint notebooks book bench quality lab clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[port,dev]'
	$(BIN)/pip install -q --no-deps qwen-tts==0.1.1
	touch $(STAMP)

test: setup
	$(MAKE) --no-print-directory lint
	$(MAKE) --no-print-directory unit
	$(MAKE) --no-print-directory notebooks

# The unit tests of qtts_lib (and the JupyterLab server test): a library break shows before any chapter runs.
# -rs lists every skip with its reason (the GPU tests skip where ncnn sees no Vulkan device, unless
# QTTS_REQUIRE_VULKAN is set, as .ci/run sets it).
unit: setup
	$(BIN)/python -m pytest tests -q -rs

# ruff over the package, the tests and the chapters (config in pyproject.toml; line length 120).
lint: setup
	$(BIN)/ruff check qtts_lib tests notebooks/*.py

# Every chapter on the default checkpoint, then VARIANT_CHAPTERS on each of VARIANTS (converted once, run again).
notebooks: setup
	$(BIN)/jupytext --to ipynb -q $(CHAPTERS)
	$(NBVAL) $(CHAPTERS:.py=.ipynb)
	for ckpt in $(VARIANTS); do \
	  echo "== $(notdir $(VARIANT_CHAPTERS:.py=)) on $$ckpt"; \
	  QTTS_CHECKPOINT=$$ckpt $(NBVAL) $(VARIANT_CHAPTERS:.py=.ipynb) || exit 1; \
	done

# PyTorch vs ncnn on BENCH_CKPT (default full-base, built and exported first if missing), interleaved repeats,
# the machine described; writes data/bench/$(BENCH_NAME).json. See qtts_lib/bench/loop.py. BENCH_PRECISION lists the
# ncnn tiers to time (chapter 13: fp32,fp16,int8); `make quality` measures what they cost against fp32.
BENCH_CKPT ?= full-base
BENCH_NAME ?= $(shell hostname -s)-$(BENCH_CKPT)
BENCH_PRECISION ?= fp32
BENCH_ARGS ?= --threads 1,2,all --frames 40 --repeats 3 --precision $(BENCH_PRECISION)
EXPORTED = QTTS_CHECKPOINT=$(BENCH_CKPT) $(BIN)/python -c "from qtts_lib import checkpoint, export, reference, settings; \
	  c = settings.checkpoint(); export.ensure(reference.load(checkpoint.ensure(c), threads=settings.threads()), c)"
bench: setup
	$(EXPORTED)
	$(BIN)/python -m qtts_lib.bench loop --checkpoint $(BENCH_CKPT) $(BENCH_ARGS) -o data/bench/$(BENCH_NAME).json

quality: setup
	$(EXPORTED)
	$(BIN)/python -m qtts_lib.bench quality --checkpoint $(BENCH_CKPT) --frames 200 \
	  -o data/bench/quality/$(BENCH_NAME).json

book: setup
	rm -rf book/chapters && mkdir -p book/chapters
	for f in $(CHAPTERS); do \
	  stem=$$(basename $$f .py); \
	  $(BIN)/jupytext --to ipynb -q -o book/chapters/$$stem.ipynb $$f || exit 1; \
	  $(BIN)/jupyter nbconvert --to notebook --execute --inplace \
	    --ExecutePreprocessor.timeout=3600 book/chapters/$$stem.ipynb || exit 1; \
	done
	$(BIN)/jupyter-book build book -W -n --keep-going
	@echo "book: $(CURDIR)/book/_build/html/index.html"

# .jupyter/labconfig: a double-clicked .py chapter opens as a notebook (jupytext's default viewer).
# JUPYTER_PREFER_ENV_PATH=1: kernel python3 is .venv's python. --allow-root only as root. LAB_ARGS: extra options.
lab: setup
	JUPYTER_CONFIG_PATH=$(CURDIR)/.jupyter JUPYTER_PREFER_ENV_PATH=1 $(BIN)/jupyter lab --ServerApp.root_dir=$(CURDIR) \
	  --ServerApp.default_url=/lab/tree/notebooks $(if $(filter 0,$(shell id -u)),--allow-root) $(LAB_ARGS)

clean:
	rm -rf book/_build book/chapters notebooks/*.ipynb data/reports data/golden data/outputs
