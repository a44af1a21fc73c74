# The two commands of README.md. Each creates the project virtualenv (.venv) if needed, installs
# everything into it, then runs. A stock Debian/Ubuntu python3 refuses `pip install` outside a
# virtualenv (PEP 668), so nothing is installed into the system interpreter.
PYTHON ?= python3
VENV ?= .venv
VPY = $(VENV)/bin/python
STAMP = $(VENV)/.installed

.PHONY: install demo test bench clean

$(VPY):
	@$(PYTHON) -m venv $(VENV) || { echo "error: '$(PYTHON) -m venv' failed; on Debian/Ubuntu: sudo apt-get install python3-venv python3-dev gcc make"; exit 2; }
	$(VPY) -m pip install -q --upgrade pip

$(STAMP): $(VPY) setup.py pyproject.toml udf/noise.pyx udf/udf_program.pyx udf/dpch_kernel.h
	$(VPY) -m pip install -q -e '.[test]'
	@touch $(STAMP)

install: $(STAMP)

demo: install
	$(VENV)/bin/dpch demo

test: install
	$(VPY) -m pytest -q

# The peers (the `bench` extra) are NOT installed into DPCH's environment: smartnoise-sql pins
# pandas<3 and opendp<0.15. bench/run_all.py installs them into bench/.venv-peers and
# bench/.venv-opendp (created on first use) and runs them there; see bench/RESULTS.md.
bench: install
	$(VPY) bench/run_all.py

clean:
	rm -rf build dpch/*.so dpch/*.c udf/*.c .dpch_data $(VENV)
