"""Compiled fast paths (Cython). Each is optional: where it cannot be built, its pure-Python twin runs."""

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

NATIVE = {
    "otel_agenttape.capture._sealing": "otel_agenttape/capture/_sealing.pyx",
    "otel_agenttape.integrity._chain": "otel_agenttape/integrity/_chain.pyx",
    "otel_agenttape.integrity._leaf": "otel_agenttape/integrity/_leaf.pyx",
    "otel_agenttape.store._spanwalk": "otel_agenttape/store/_spanwalk.pyx",
    "otel_agenttape.receiver._wirecount": "otel_agenttape/receiver/_wirecount.pyx",
    "otel_agenttape.tape._sealed_entries": "otel_agenttape/tape/_sealed_entries.pyx",
    "otel_agenttape.codec._otlp_encode": "otel_agenttape/codec/_otlp_encode.pyx",
}


class OptionalBuildExt(build_ext):
    """Build each compiled module if the machine can; otherwise say so and go on without it."""

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:  # no compiler, no Python headers, a failing compiler...
            print(f"warning: {ext.name} not compiled ({exc}); its pure-Python twin will run")


try:
    from Cython.Build import cythonize
except ImportError:  # no Cython: the pure-Python paths are used
    ext_modules = []
else:
    ext_modules = cythonize(
        [Extension(name, [src]) for name, src in NATIVE.items()],
        language_level=3,
        quiet=True,
    )

setup(ext_modules=ext_modules, cmdclass={"build_ext": OptionalBuildExt})
