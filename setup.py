"""The one compiled part of raftka: the records-section walk of the produce
path (`storage._record_scan`, see storage/record_validation.py). It is
optional: without a C compiler the install goes on and the pure-Python walk
runs instead. Everything else about the package is in pyproject.toml."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("storage._record_scan", ["storage/_record_scan.c"], optional=True,
                  extra_compile_args=["-O2"]),
    ],
)
