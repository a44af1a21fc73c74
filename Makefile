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

bench: install
	$(PIP) install -q -e '.[bench]'
	$(PYTHON) bench/run_all.py

clean:
	rm -rf build dpch/*.so dpch/*.c udf/*.c .dpch_data
