# The two commands of README.md. Each installs everything it needs first.
PYTHON ?= python3
PIP = $(PYTHON) -m pip

.PHONY: install demo test bench clean

install:
	$(PIP) install -q -e '.[test]'

demo: install
	dpch demo

test: install
	$(PYTHON) -m pytest -q

# The peers (the `bench` extra) are NOT installed into DPCH's environment: smartnoise-sql pins
# pandas<3 and opendp<0.15. bench/run_all.py installs them into bench/.venv-peers and
# bench/.venv-opendp (created on first use) and runs them there; see bench/RESULTS.md.
bench: install
	$(PYTHON) bench/run_all.py

clean:
	rm -rf build dpch/*.so dpch/*.c udf/*.c .dpch_data
