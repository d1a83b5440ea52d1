"""Compiled fast paths (Cython). Each is optional: where it cannot be built, its pure-Python twin runs."""

from setuptools import Extension, setup

NATIVE = {
    "otel_agenttape.capture._sealing": "otel_agenttape/capture/_sealing.pyx",
    "otel_agenttape.integrity._chain": "otel_agenttape/integrity/_chain.pyx",
    "otel_agenttape.integrity._leaf": "otel_agenttape/integrity/_leaf.pyx",
    "otel_agenttape.store._spanwalk": "otel_agenttape/store/_spanwalk.pyx",
}

try:
    from Cython.Build import cythonize
except ImportError:  # no Cython: the pure-Python paths are used
    ext_modules = []
else:
    ext_modules = cythonize(
        [Extension(name, [src], optional=True) for name, src in NATIVE.items()],
        language_level=3,
        quiet=True,
    )

setup(ext_modules=ext_modules)
